"""The fast decision path (issue 12): warm caches, no torch/transformers, the same decision as the slow path.

No timing here (that is `python -m benchmarks decision`): these tests pin what makes it fast and
that it changes nothing. A "slow" value is computed the way the launcher computed it before the
caches: data generated, WordPiece trained, config built with transformers, parameters counted on
the meta device, the governor loaded with mlflow.pyfunc.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, production_store

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]
HEAVY = ("torch", "transformers", "tokenizers")
DRY_RUN = ["finetune", "--model", "bert-base", "--task", "rte", "--device", "sim", "--dry-run", "--probe-steps", "0",
           "--train-size", "512", "--json"]

# Runs the CLI in this process and reports the decision and which heavy packages ended up imported.
PROBE = r"""
import json, sys
from dvfs_mlops.app import cli
sys.argv = ["dvfs-mlops", *sys.argv[1:]]
try:
    cli.main()
except SystemExit as e:
    code = e.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "tokenizers"})
pyfunc_code = sorted(m for m in sys.modules if m.startswith("code_model_") or m == "policy_tree")  # what mlflow.pyfunc imports
print("PROBE " + json.dumps({"code": code, "heavy": heavy, "model_code": pyfunc_code, "mlflow": "mlflow" in sys.modules}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store whose production governor is the published tree, its own cache folder, and an env for subprocesses."""
    tmp = tmp_path_factory.mktemp("speed")
    env = production_store(tmp, DVFS_CACHE_DIR=str(tmp / "cache"))
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return tmp, env


@pytest.fixture
def in_store(store, monkeypatch):
    tmp, env = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    monkeypatch.setenv("DVFS_CACHE_DIR", env["DVFS_CACHE_DIR"])
    monkeypatch.chdir(tmp)
    return tmp


def _probe(env: dict, cwd: Path, *args: str) -> tuple[dict, dict, str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    lines = r.stdout.strip().splitlines()
    report = json.loads(lines[-1].removeprefix("PROBE ")) if lines and lines[-1].startswith("PROBE ") else None
    assert report is not None and report["code"] == 0, r.stderr
    return json.loads("\n".join(lines[:-1])), report, r.stderr


def test_warm_dry_run_imports_neither_torch_nor_transformers_and_decides_as_the_cold_one(store):
    tmp, env = store
    cold, cold_report, _ = _probe(env, tmp, *DRY_RUN)  # fills the caches
    assert set(cold_report["heavy"]) >= {"torch", "transformers"}, "the cold run computes the slow way"
    warm, warm_report, stderr = _probe(env, tmp, *DRY_RUN)
    assert warm_report["heavy"] == [], f"a warm dry run imported {warm_report['heavy']}"
    assert warm_report["model_code"] == [], "the governor was loaded through mlflow.pyfunc, not read from policy.json"
    assert not warm_report["mlflow"], "the store was not written, so its governor is remembered (governor_cache.py)"
    assert warm["decision"] == cold["decision"]
    assert warm["decision"]["freq_mhz"] == 816.0 and warm["decision"]["path"].endswith("-> 816 MHz")
    assert "dry run: stopping after the decision" in stderr


def test_cached_features_equal_the_slow_way(in_store, monkeypatch):
    from dvfs_mlops.job.workloads import features
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    cases = [("bert-base", "rte"), ("pythia-70m", "mrpc"), ("bert-tiny", "stsb"), ("pythia-14m", "mnli")]
    slow = {c: prepare_workload(*c, train_size=300, dev_size=16, use_cache=False) for c in cases}
    for c in cases:
        prepare_workload(*c, train_size=300, dev_size=16)  # computes and stores
    monkeypatch.setattr(features, "count_params", lambda config, peft=None: pytest.fail("a warm workload counted parameters"))
    monkeypatch.setattr("dvfs_mlops.job.workloads.prepare.train_wordpiece", lambda *a, **k: pytest.fail("a warm workload trained a tokenizer"))
    for c in cases:
        warm = prepare_workload(*c, train_size=300, dev_size=16)
        assert warm.features == slow[c].features, c
        assert warm.features.num_params == slow[c].features.num_params and warm.features.avg_seq_len == slow[c].features.avg_seq_len
        assert warm.train_lengths == [len(x) for x in slow[c].train.ids] and warm.pad_id == slow[c].encoder.pad_id
        assert not warm.loaded  # nothing but the caches was read
    assert slow[("bert-base", "rte")].features.num_params == 109_483_778


def test_cached_param_count_is_exact_for_every_preset(in_store):
    import torch
    from transformers import AutoModelForSequenceClassification

    from dvfs_mlops.job.workloads.features import classifier_config, model_facts
    from dvfs_mlops.job.workloads.zoo import PRESETS, resolve_model

    for name in PRESETS:
        for num_labels in (1, 3):
            spec = resolve_model(name)
            stored = model_facts(spec, num_labels)
            again = model_facts(resolve_model(name), num_labels)  # a fresh spec: read back from disk
            with torch.device("meta"):
                built = AutoModelForSequenceClassification.from_config(classifier_config(spec, num_labels, 0))
            assert stored == again
            assert stored.num_params == sum(p.numel() for p in built.parameters() if p.requires_grad), (name, num_labels)
            assert (stored.num_layers, stored.hidden_size) == (PRESETS[name].num_layers, PRESETS[name].hidden_size)
            assert stored.model_type == ("encoder" if PRESETS[name].family == "bert" else "decoder")
    # meta and a real build count alike
    spec = resolve_model("bert-tiny")
    real = AutoModelForSequenceClassification.from_config(classifier_config(spec, 2, 0))
    assert model_facts(spec, 2).num_params == sum(p.numel() for p in real.parameters() if p.requires_grad)


CONFIG_FILES = {
    "roberta": {"model_type": "roberta", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 128, "max_position_embeddings": 130},
    "gpt2": {"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 3, "n_head": 2, "n_positions": 256},
    "distilbert": {"model_type": "distilbert", "vocab_size": 1000, "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128},
    "bert-relative": {"model_type": "bert", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "intermediate_size": 128, "position_embedding_type": "relative_key"},
}


def test_cached_param_count_is_exact_for_config_files_and_a_changed_file_is_a_miss(in_store, tmp_path):
    from dvfs_mlops.job.workloads.features import classifier_config, compute_model_facts, count_params, model_facts
    from dvfs_mlops.job.workloads.zoo import resolve_model

    for label, data in CONFIG_FILES.items():
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(data))
        first = model_facts(resolve_model(config_path=path), 2)
        spec = resolve_model(config_path=path)
        assert model_facts(spec, 2) == first == compute_model_facts(spec, 2), label
        assert (first.num_params, first.trainable_params) == count_params(classifier_config(spec, 2, 0))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG_FILES["roberta"]))
    assert model_facts(resolve_model(config_path=folder), 2) == model_facts(resolve_model(config_path=tmp_path / "roberta.json"), 2)
    # the same file name with another layer count: another key, the right count
    path = tmp_path / "roberta.json"
    before = model_facts(resolve_model(config_path=path), 2)
    path.write_text(json.dumps({**CONFIG_FILES["roberta"], "num_hidden_layers": 4}))
    after = model_facts(resolve_model(config_path=path), 2)
    assert after.num_layers == 4 and after.num_params > before.num_params
    assert after == compute_model_facts(resolve_model(config_path=path), 2)


def test_token_lengths_cache_is_keyed_by_its_inputs(in_store, tmp_path, monkeypatch):
    from dvfs_mlops.job.workloads import prepare
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    a = prepare_workload("bert-tiny", "sst2", train_size=200, dev_size=8)
    for other in ({"seed": 1}, {"train_size": 201}, {"max_length": 16}):
        kw = {"train_size": 200, "dev_size": 8, **other}
        with monkeypatch.context() as m:
            m.setattr(prepare, "MAX_LENGTH", kw.pop("max_length", prepare.MAX_LENGTH))  # the truncation length, a constant
            cached, slow = prepare_workload("bert-tiny", "sst2", **kw), prepare_workload("bert-tiny", "sst2", **kw, use_cache=False)
        assert cached.train_lengths == slow.train_lengths and cached.train_lengths != a.train_lengths, other
    # a GLUE folder: editing train.tsv is a miss
    folder = tmp_path / "glue" / "SST-2"
    folder.mkdir(parents=True)
    rows = "sentence\tlabel\n" + "".join(f"word {'x ' * (i % 7)}end\t{i % 2}\n" for i in range(40))
    (folder / "train.tsv").write_text(rows)
    (folder / "dev.tsv").write_text("sentence\tlabel\na b\t0\nc d e\t1\n")
    first = prepare_workload("bert-tiny", "sst2", data_dir=str(tmp_path / "glue"))
    assert first.loaded and prepare_workload("bert-tiny", "sst2", data_dir=str(tmp_path / "glue")).train_lengths == first.train_lengths
    (folder / "train.tsv").write_text(rows + "a much longer sentence than any before it here\t1\n")
    second = prepare_workload("bert-tiny", "sst2", data_dir=str(tmp_path / "glue"))
    assert second.loaded and second.n_train == 41
    assert second.train_lengths == prepare_workload("bert-tiny", "sst2", data_dir=str(tmp_path / "glue"), use_cache=False).train_lengths


def test_direct_policy_read_decides_as_the_pyfunc(in_store):
    from dvfs_mlops.job.workloads.zoo import PRESETS
    from dvfs_mlops.mlops.governor import PolicyModel, load_governor
    from dvfs_mlops.model.workload import WorkloadFeatures

    direct = load_governor()
    pyfunc = load_governor(direct=False)
    assert isinstance(direct.model, PolicyModel) and not isinstance(pyfunc.model, PolicyModel)
    assert direct.ref == pyfunc.ref and direct.ref.alias == "production" and direct.ref.version == 1
    for name, p in PRESETS.items():
        for seq in (11.0, 40.5, 53.0, 72.3):
            for util in (10.0, 22.0, 60.0, 97.6):
                f = WorkloadFeatures("encoder" if p.family == "bert" else "decoder", p.num_layers, p.hidden_size, 10**8, seq, util)
                assert direct.decide(f, TABLE) == pyfunc.decide(f, TABLE), (name, seq, util)
    by_version = load_governor("models:/dvfs-governor/1")
    assert isinstance(by_version.model, PolicyModel) and by_version.ref == load_governor("models:/dvfs-governor/1", direct=False).ref


def test_other_governor_code_goes_through_the_pyfunc(in_store, tmp_path, monkeypatch):
    from dvfs_mlops.mlops import pyfunc
    from dvfs_mlops.mlops.governor import PolicyModel, load_governor

    edited = tmp_path / "model_code.py"
    edited.write_text(pyfunc.CODE.read_text() + "\n# another version\n")
    monkeypatch.setattr(pyfunc, "CODE", edited)
    governor = load_governor()
    assert not isinstance(governor.model, PolicyModel) and governor.ref.version == 1


def test_a_version_registered_by_an_earlier_release_is_still_read_directly(tmp_path, monkeypatch):
    """Versions registered before the package moved into layer folders ship a model_code.py that differs from today's in
    one fallback import line only: they decide alike, so they keep the fast path (and the alias cache)."""
    from dvfs_mlops.mlops import pyfunc, registry
    from dvfs_mlops.mlops.governor import PolicyModel, load_governor

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVFS_CACHE_DIR", str(tmp_path / "cache"))
    today = pyfunc.CODE
    earlier = tmp_path / "model_code.py"
    earlier.write_text(today.read_text().replace("from dvfs_mlops.model.governor import policy_tree",
                                                 "from dvfs_mlops.governor import policy_tree"))
    assert earlier.read_bytes() != today.read_bytes()
    monkeypatch.setattr(pyfunc, "CODE", earlier)
    registry.bootstrap(say=lambda m: None)  # registered with the earlier release's code
    monkeypatch.setattr(pyfunc, "CODE", today)
    registry.promote("1", say=lambda m: None)
    governor = load_governor()
    assert isinstance(governor.model, PolicyModel) and governor.ref.version == 1
    assert governor.decide({"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "num_params": 10**8,
                            "avg_seq_len": 72.3, "gpu_util_pct": 97.6}, TABLE) == load_governor(direct=False).decide(
        {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "num_params": 10**8, "avg_seq_len": 72.3,
         "gpu_util_pct": 97.6}, TABLE)
    # any other code is not ours: the pyfunc (the alias cache, which remembers only our code's decisions, emptied)
    import shutil

    monkeypatch.setattr(pyfunc, "EARLIER_CODE_SHA256", frozenset())
    shutil.rmtree(tmp_path / "cache")
    assert not isinstance(load_governor().model, PolicyModel)


def test_slow_and_fast_plan_decide_alike_and_a_probe_still_trains(in_store, monkeypatch):
    from dvfs_mlops.app import finetune as launcher
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import governor as governors

    cfg, dev = FinetuneConfig(steps=4, batch_size=8), SimDevice()
    board, no_probe = board_of(dev), launcher.LaunchOptions(probe_steps=0)
    prepare_workload("bert-mini", "mrpc", train_size=96, dev_size=16)  # warm
    fast = prepare_workload("bert-mini", "mrpc", train_size=96, dev_size=16)
    assert not fast.loaded
    fast_d = launcher.plan_decision(dev, board, Job(fast, cfg), no_probe, lambda m: None)
    assert not fast.loaded, "a probe-less decision needs neither data nor tokenizer"
    slow = prepare_workload("bert-mini", "mrpc", train_size=96, dev_size=16, use_cache=False)
    direct = governors.load_governor
    loaded = []
    monkeypatch.setattr(governors, "load_governor", lambda uri=None: loaded.append(direct(uri, direct=False)) or loaded[-1])
    slow_d = launcher.plan_decision(dev, board, Job(slow, cfg), no_probe, lambda m: None)
    assert loaded and not isinstance(loaded[-1].model, governors.PolicyModel)
    assert (fast_d.freq_mhz, fast_d.path, fast_d.features, fast_d.expected_saving) == \
        (slow_d.freq_mhz, slow_d.path, slow_d.features, slow_d.expected_saving)
    monkeypatch.setattr(governors, "load_governor", direct)
    # probe steps > 0 on a warm, lazy workload: it loads the data and trains the probe
    probed = launcher.plan_decision(dev, board, Job(fast, cfg), launcher.LaunchOptions(probe_steps=2), lambda m: None)
    assert fast.loaded and probed.util_source.startswith("probe: 2 steps at maxn")
    assert probed.features.num_params == slow_d.features.num_params and probed.features.avg_seq_len == slow_d.features.avg_seq_len


def test_a_written_store_is_asked_again_and_a_new_production_version_is_seen(store, tmp_path):
    """Promotion between two decisions: the remembered v1 is not used, the next decision names v2."""
    import shutil

    from tests.conftest import run_cli

    src, env = store
    db = tmp_path / "mlflow.db"
    shutil.copy(src / "mlflow.db", db)  # a store of this test's own (the module's store stays at v1)
    # the module's caches: the workload's facts are keyed by content, the remembered governor by this store's own URI
    env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    first, _, _ = _probe(env, tmp_path, *DRY_RUN)
    warm, warm_report, _ = _probe(env, tmp_path, *DRY_RUN)
    assert first["decision"]["governor"]["version"] == 1 and not warm_report["mlflow"] and warm["decision"] == first["decision"]
    assert run_cli("registry", "bootstrap", env=env).returncode == 0  # v2
    r = run_cli("registry", "promote", "2", "--force", env=env)
    assert r.returncode == 0, r.stderr
    after, after_report, _ = _probe(env, tmp_path, *DRY_RUN)
    assert after_report["mlflow"], "a written store must be asked again"
    assert after["decision"]["governor"]["version"] == 2 and after["decision"]["freq_mhz"] == 816.0
    again, again_report, _ = _probe(env, tmp_path, *DRY_RUN)
    assert not again_report["mlflow"] and again["decision"] == after["decision"]


def test_an_entry_is_kept_only_when_the_store_did_not_change_meanwhile(tmp_path):
    from dvfs_mlops.mlops import alias_cache as governor_cache

    db = tmp_path / "mlflow.db"
    db.write_bytes(b"x" * 10)
    uri, target = f"sqlite:///{db}", "models:/dvfs-governor@production"
    found = governor_cache.CachedGovernor({"tree": {"freq_mhz": 612.0}}, {"uri": target, "name": "dvfs-governor", "version": 3,
                                                                        "alias": "production", "tags": {}})
    before = governor_cache.store_stamp(uri)
    db.write_bytes(b"y" * 11)  # a promotion landed while MLflow was being asked
    assert not governor_cache.remember(uri, target, before, found)
    assert governor_cache.lookup(uri, target) is None
    assert governor_cache.remember(uri, target, governor_cache.store_stamp(uri), found)
    assert governor_cache.lookup(uri, target) == found
    (tmp_path / "mlflow.db-journal").write_bytes(b"j")  # a write in progress counts as a change
    assert governor_cache.lookup(uri, target) is None


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "postgresql://u@localhost/mlflow", "sqlite:///:memory:",
                                 "sqlite:///mlflow.db?timeout=5", "file:///tmp/mlruns"])
def test_only_a_plain_sqlite_store_is_remembered(uri):
    from dvfs_mlops.mlops import alias_cache as governor_cache

    found = governor_cache.CachedGovernor({"tree": {"freq_mhz": 612.0}}, {"version": 1})
    assert governor_cache.store_stamp(uri) is None
    assert not governor_cache.remember(uri, "models:/g@production", None, found)
    assert governor_cache.lookup(uri, "models:/g@production") is None


def _sweep_probe(env: dict, cwd: Path, experiment: str) -> dict:
    args = ["sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m", "--tasks", "sst2,stsb", "--freqs", "510,1300.5",
            "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", experiment]
    r = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    report = json.loads(r.stdout.strip().splitlines()[-1].removeprefix("PROBE "))
    assert report["code"] == 0, r.stderr
    return report


def test_a_warm_profile_only_sweep_imports_neither_torch_nor_transformers_and_measures_the_same(store):
    """Profile-only twin points are planned from the cached token lengths (finetune.profile_only): no data, tokenizer,
    model config or torch. A fleet of twin workers, or the paper preset, starts in half the time."""
    from mlflow.tracking import MlflowClient

    tmp, env = store
    cold = _sweep_probe(env, tmp, "profile-cold")  # fills the caches (lengths, traces)
    assert set(cold["heavy"]) >= {"torch", "transformers"}
    warm = _sweep_probe(env, tmp, "profile-warm")
    assert warm["heavy"] == [], f"a warm profile-only sweep imported {warm['heavy']}"
    c = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])

    def measured(name: str) -> dict[str, tuple[float, float, float]]:
        e = c.get_experiment_by_name(name)
        runs = c.search_runs([e.experiment_id], filter_string="tags.`dvfs.point` != ''")
        return {r.data.tags["dvfs.point"]: (r.data.metrics["energy_j"], r.data.metrics["energy_expected_j"], r.data.metrics["time_s"])
                for r in runs}

    cold_points = measured("profile-cold")
    assert len(cold_points) == 12 and measured("profile-warm") == cold_points
