"""Hub loading without a hub: the endpoint is asked once; unreachable, `--data-source hub` and `--pretrained ORG/NAME`
read the local caches (a copy cached while online still loads) or fail at once in one line, with no retries.

The hub is a local endpoint here: a closed port (connection refused, as a machine without a network answers) or a
local HTTP server (it answers). The caches are laid out as the libraries write them: datasets' own builder writes the
arrow files, placed where a hub download keeps them (`<cache>/nyu-mll___glue/rte/0.0.0/<commit>/`, the folders
datasets' `CachedDatasetModuleFactory` looks in, datasets/load.py); a model is the `models--ORG--NAME/snapshots/<commit>`
+ `refs/main` layout of huggingface_hub's cache (huggingface_hub `file_download.py`, `try_to_load_from_cache`).
"""
from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads import hub
from dvfs_mlops.job.workloads.tasks import load_task
from tests.conftest import production_store

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The hub libraries' endpoint is a closed local port; hub_reachable's answers are forgotten before and after."""
    from huggingface_hub import constants

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    hub.hub_reachable.cache_clear()
    yield endpoint
    hub.hub_reachable.cache_clear()


@pytest.fixture
def hub_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A local server as the hub's endpoint; yields the request lines it answered."""
    from huggingface_hub import constants

    seen: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            seen.append(self.requestline)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    hub.hub_reachable.cache_clear()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
        hub.hub_reachable.cache_clear()


def test_the_hub_is_asked_once_per_process(hub_up):
    endpoint = hub.hub_endpoint()
    assert hub.hub_reachable(endpoint) and hub.hub_reachable(endpoint)
    with hub.pretrained_offline_unless_reachable("some-org/some-model") as options:
        assert options == {}
    assert [line.split()[:2] for line in hub_up] == [["HEAD", "/"]]  # one request for all three answers


def test_an_unreachable_hub_means_offline_mode_for_hub_names_never_for_folders(hub_down, tmp_path):
    from huggingface_hub import constants

    assert not hub.hub_reachable(hub_down)
    with hub.pretrained_offline_unless_reachable("some-org/some-model") as options:
        assert options == {"local_files_only": True} and constants.is_offline_mode()
    assert not constants.is_offline_mode()
    with hub.pretrained_offline_unless_reachable(str(tmp_path)) as options:  # a local folder asks nobody
        assert options == {} and not constants.is_offline_mode()


def test_a_hanging_name_lookup_is_not_waited_for(monkeypatch):
    """A resolver that never answers (a socket timeout does not bound the lookup): unreachable after REACH_TIMEOUT_S,
    while the lookup still hangs."""
    release = threading.Event()
    hanging: list[str] = []
    gave_up: list[str] = []

    def lookup(host, *args, **kwargs):
        hanging.append(host)
        release.wait(5)
        gave_up.append(host)
        raise OSError("no answer")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(hub, "REACH_TIMEOUT_S", 0.2)
    hub.hub_reachable.cache_clear()
    try:
        assert hub.hub_reachable("http://hub.invalid") is False
        assert hanging == ["hub.invalid"] and gave_up == []  # it returned while the lookup was still hanging
    finally:
        release.set()
        hub.hub_reachable.cache_clear()


def test_offline_mode_is_datasets_own_and_only_for_the_block(hub_down):
    import datasets.config

    offline_before = datasets.config.HF_HUB_OFFLINE
    with hub.datasets_offline_unless_reachable() as online:
        assert online is False and datasets.config.HF_HUB_OFFLINE is True
    assert datasets.config.HF_HUB_OFFLINE is offline_before


def test_online_the_loader_asks_the_hub_as_before(hub_up, monkeypatch, tmp_path):
    """A reachable hub: datasets runs online (no offline mode) and is asked for nyu-mll/glue, the task's config."""
    import datasets
    import datasets.config

    rte = tmp_path / "rte.tsv"
    rte.write_text("sentence1\tsentence2\tlabel\nA man runs.\tA person runs.\t0\n")
    calls = []
    real_load = datasets.load_dataset

    def load(path, name=None, **kw):
        calls.append((path, name, datasets.config.HF_HUB_OFFLINE))
        return real_load("csv", data_files={"train": str(rte), "validation": str(rte)}, delimiter="\t", cache_dir=str(tmp_path / "c"))

    monkeypatch.setattr(datasets, "load_dataset", load)
    d = load_task("rte", source="hub")
    assert calls == [("nyu-mll/glue", "rte", False)] and d.train[0].text_b == "A person runs."


def test_a_reachable_hub_that_fails_the_load_is_one_line_naming_the_ways_out(hub_up, monkeypatch):
    import datasets

    def refused(*a, **k):
        raise ConnectionError("the dataset server hung up")

    monkeypatch.setattr(datasets, "load_dataset", refused)
    with pytest.raises(DvfsError) as e:
        load_task("sst2", source="hub")
    message = str(e.value)
    assert message == ("cannot load nyu-mll/glue/sst2 from the hub (ConnectionError); use --data-dir DIR (GLUE TSV files) "
                       "or --data-source synthetic")


def _cache_glue_rte(cache: Path, tmp_path: Path) -> None:
    """nyu-mll/glue's rte config in the datasets cache, written by datasets' own parquet builder (as a hub download
    is: the hub serves GLUE as parquet), in the folder a hub download of commit COMMIT uses."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    rows = {"train": [("A man runs.", "A person runs.", 0), ("It rains.", "It is dry.", 1), ("Cats purr.", "Cats sing.", 1)],
            "validation": [("Birds fly.", "Birds move.", 0)]}
    files = {}
    for split, examples in rows.items():
        files[split] = str(tmp_path / f"{split}.parquet")
        pq.write_table(pa.table({"sentence1": [e[0] for e in examples], "sentence2": [e[1] for e in examples],
                                 "label": [e[2] for e in examples], "idx": list(range(len(examples)))}), files[split])
    built = tmp_path / "built"
    builder = Parquet(cache_dir=str(built), dataset_name="glue", config_name="rte", data_files=files)
    builder.download_and_prepare()
    target = cache / "nyu-mll___glue" / "rte" / "0.0.0" / COMMIT
    target.mkdir(parents=True)
    for f in Path(builder.cache_dir).iterdir():
        if f.suffix in (".arrow", ".json"):
            shutil.copy(f, target / f.name)


def test_offline_a_cached_copy_still_loads(hub_down, monkeypatch, tmp_path):
    import datasets.config

    cache = tmp_path / "datasets"
    _cache_glue_rte(cache, tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    d = load_task("rte", source="hub")
    assert d.source == "hub" and [e.text_a for e in d.train] == ["A man runs.", "It rains.", "Cats purr."]
    assert [e.label for e in d.train] == [0.0, 1.0, 1.0] and d.dev[0].text_b == "Birds move."


def test_offline_without_a_cached_copy_is_one_line_naming_the_ways_out(hub_down, monkeypatch, tmp_path):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty")
    with pytest.raises(DvfsError) as e:
        load_task("sst2", source="hub")
    message = str(e.value)
    assert "\n" not in message and "unreachable" in message and hub_down in message
    assert "--data-dir DIR" in message and "--data-source synthetic" in message


def _offline_env(tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HOME": str(tmp_path / "hf"),
            "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}


def test_finetune_on_the_hub_source_offline_fails_at_once_in_one_line(tmp_path):
    """As a user meets it: one `Error:` line, exit 2, and none of datasets' retry lines (each one a backoff sleep)."""
    env = {**os.environ, **_offline_env(tmp_path), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    r = subprocess.run([sys.executable, "-m", "dvfs_mlops", "finetune", "--model", "bert-tiny", "--task", "rte", "--data-source", "hub",
                        "--device", "sim", "--dry-run", "--probe-steps", "0"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: the Hugging Face Hub (http://127.0.0.1:") and "--data-dir DIR" in lines[0], lines[0]


def _cache_model(hub_cache: Path, repo: str, folder: Path) -> None:
    """`folder` (a save_pretrained checkpoint) as huggingface_hub caches repo `repo` at COMMIT."""
    root = hub_cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    shutil.copytree(folder, root / "snapshots" / COMMIT)


def test_finetune_from_a_cached_hub_model_offline_and_one_line_without_it(tmp_path):
    """`--pretrained ORG/NAME` offline: a model cached while online trains (config, tokenizer and weights from the
    cache); one that was never cached is one line, at once."""
    from tests.test_models import _local_pretrained

    env = {**os.environ, **_offline_env(tmp_path), **production_store(tmp_path)}
    checkpoint = tmp_path / "checkpoint"
    _local_pretrained(checkpoint)
    _cache_model(Path(env["HF_HUB_CACHE"]), "tiny-org/tiny-bert", checkpoint)
    args = ["finetune", "--task", "sst2", "--device", "sim", "--steps", "2", "--batch-size", "8", "--train-size", "32",
            "--probe-steps", "0", "--no-save-model"]
    r = subprocess.run([sys.executable, "-m", "dvfs_mlops", *args, "--pretrained", "tiny-org/tiny-bert"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done (SIMULATED)" in r.stderr and "Retrying" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "dvfs_mlops", *args, "--pretrained", "tiny-org/never-cached"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: cannot load pretrained model 'tiny-org/never-cached' (offline? pass a local folder)"), lines[0]
