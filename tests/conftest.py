from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.fakes.kernelfs import KernelTree, fuse_available, mount_orin
from testkit.fakes.sysfs import FakeJetson, FakeKernel, make_orin_tree

pytest_plugins = ["testkit.skips"]  # the closing line of a run: what was skipped, and the command that enables it

REPO = Path(__file__).resolve().parents[1]
RUN_DIR_ENV = "DVFS_TEST_RUN_DIR"  # run_dir(): set by the run's first process, inherited by its workers and commands
_RUN_DIR_MADE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """One torch/OpenMP compute thread per test process and per CLI it starts (they inherit the environment).

    `make test` runs two xdist workers on two cores, and each may start CLIs that train: with torch's
    default of one thread per core, its spinning thread pools fight over the cores (two smoke sweeps
    side by side: 41 s each; with one thread each, 20 s). Set before anything imports torch; a value
    the caller exported is kept. Also: the command line's defaults, and the run's shared folder (`run_dir`), on tmpfs
    where it can (`ram_backed_tmp`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    # The command line's defaults (no progress bars), as every command sets them when it starts, set for the whole run:
    # a command run in-process (CliRunner) would set them in this process for good, and the warm interpreter, which
    # imported huggingface_hub without them, would then start every later command cold (testkit/warm.py COLD_ENV).
    from dvfs_mlops import settings

    settings.set_defaults(settings.CLI_DEFAULTS)
    if RUN_DIR_ENV not in os.environ:  # the first process of the run (xdist's controller): its workers inherit it
        ram = ram_backed_tmp()
        if ram is not None:  # before pytest makes its temporary root (tempfile reads TMPDIR) and the workers start
            os.environ["TMPDIR"] = str(ram)
            tempfile.tempdir = None
        os.environ[RUN_DIR_ENV] = tempfile.mkdtemp(prefix="dvfs-tests-")
        config.stash[_RUN_DIR_MADE] = Path(os.environ[RUN_DIR_ENV])


RAM_TMP, RAM_TMP_MIN_FREE = Path("/dev/shm"), 4 << 30


def ram_backed_tmp() -> Path | None:
    """/dev/shm where it is a tmpfs with 4 GiB free and TMPDIR is unset (a TMPDIR the caller chose wins); else None.

    The tests' temporary folders (tmp_path, the MLflow SQLite stores, the commands' own temporary files) go there: SQLite
    commits every write with fsync, 20 ms on this VM's disk against 0.1 ms on tmpfs, and MLflow's store commits
    each write (a smoke sweep: about 280 commits). A whole run leaves about 600 MB there, kept until the next run (pyproject's
    `tmp_path_retention_count = 1`). Docker's default /dev/shm (64 MB) is too small and is left alone."""
    if os.environ.get("TMPDIR") or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return None
    try:
        mounts = Path("/proc/mounts").read_text().split("\n")
        room = os.statvfs(RAM_TMP)
    except OSError:
        return None
    tmpfs = any(line.split()[1:3] == [str(RAM_TMP), "tmpfs"] for line in mounts if len(line.split()) > 2)
    writable = os.access(RAM_TMP, os.W_OK | os.X_OK)
    return RAM_TMP if tmpfs and writable and room.f_bavail * room.f_frsize >= RAM_TMP_MIN_FREE else None


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_RUN_DIR_MADE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(RUN_DIR_ENV, None)


def run_dir() -> Path:
    """A folder shared by every process of this test run (all xdist workers), for what is made once and then only
    read or added to by content key: the step traces, the migrated store template. Gone when the run ends."""
    return Path(os.environ[RUN_DIR_ENV])


def _made_once(name: str, make: Callable[[Path], None]) -> Path:
    """The folder `run_dir()/name`, filled by `make(folder)` in the first process of the run that asks (the others
    wait on a file lock, then use it; a `make` that failed is tried again by the next one)."""
    target, done = run_dir() / name, run_dir() / f"{name}.done"
    with open(run_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            make(target)
            done.touch()
    return target


# The modules that take longest (summed seconds of a whole `make test` run, `--durations=0`), heaviest first. `make test`
# runs `--dist loadfile --no-loadscope-reorder`, so xdist hands files out in collection order: with these first, no
# long file starts last and runs alone while the other worker idles. test_sweep leads: it makes the shared smoke sweep
# that test_registry and test_loop_again copy later.
SLOW_MODULES_FIRST = ("test_sweep.py", "test_fleet.py", "test_packaging.py", "test_fleet_tracking.py", "test_faults.py",
                      "test_decision_speed.py", "test_loop_again.py", "test_lifecycle.py", "test_finetune_progress.py", "test_server.py",
                      "test_replay_loop.py", "test_hub_offline.py", "test_multigpu.py", "test_ui_browser.py", "test_calibrate.py",
                      "test_governor_configurations.py", "test_twin.py", "test_registry.py", "test_adaptive_sweep.py", "test_instruct.py",
                      "test_models.py", "test_lora.py", "test_families.py", "test_refine_knobs.py", "test_hardware_path.py", "test_tasks.py",
                      "test_warmup.py", "test_clockd_attacks.py", "test_docs_site.py", "test_bad_input.py", "test_launcher.py",
                      "test_kernelfs.py", "test_jetson.py", "test_refine.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module's tests keep their order


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own state folders (locks, journals: under its own $DVFS_SYSTEM_STATE_PREFIX) and never sees
    the real sysfs. Returns the journal folder, made private (0700) as the package wants it."""
    from dvfs_mlops.hw.guard import journal_dir, open_private_dir

    monkeypatch.setenv("DVFS_SYSTEM_STATE_PREFIX", str(tmp_path_factory.mktemp("state")))
    os.close(open_private_dir(journal_dir()))
    for name in ("SUDO_UID", "SUDO_GID", "SUDO_USER"):  # under sudo the state dir is the invoking user's, not this one
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(tmp_path_factory.mktemp("empty-sysfs")))
    # The fake boards have no GPU: train on the CPU (the documented --torch-device override).
    # Tests of the CUDA check unset it.
    monkeypatch.setenv("DVFS_TORCH_DEVICE", "cpu")
    return journal_dir()


@pytest.fixture(scope="session")
def trace_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step traces are shared by the whole run, every xdist worker and the commands they start (capturing one costs
    ~0.1-1 s of CPU; the twin's calibration alone captures 39). TraceCache writes each entry atomically under its
    content key, so two processes capturing the same trace at once leave one whole file."""
    if os.environ.get("DVFS_TEST_TRACE_CACHE"):
        return Path(os.environ["DVFS_TEST_TRACE_CACHE"])
    folder = run_dir() / "traces"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def _trace_cache_env(trace_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVFS_CACHE_DIR", str(trace_cache_dir))


@pytest.fixture
def state_dir(_isolated_state: Path) -> Path:
    """This test's journal folder (its locks are in `guard.lock_dir()`, beside it under the same prefix)."""
    return _isolated_state


@pytest.fixture(params=[5, 6], ids=["jetpack5", "jetpack6"])
def orin(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJetson:
    fake = make_orin_tree(tmp_path / "root", jetpack=request.param)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    return fake


@pytest.fixture
def orin6(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJetson:
    fake = make_orin_tree(tmp_path / "root", jetpack=6)
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(fake.root))
    return fake


def _kernel_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jetpack: int) -> Iterator[KernelTree]:
    ok, why = fuse_available()
    if not ok:
        if os.environ.get("DVFS_REQUIRE_FUSE") == "1":  # CI sets it: a skipped kernel test would hide a broken setup
            pytest.fail(f"DVFS_REQUIRE_FUSE=1 but the FUSE kernel tree cannot be mounted: {why}")
        pytest.skip(f"FUSE kernel tree unavailable: {why}")
    tree = mount_orin(tmp_path / "kernel", jetpack=jetpack)
    try:
        monkeypatch.setenv("DVFS_SYSFS_ROOT", str(tree.root))
        yield tree
    finally:
        tree.unmount()


@pytest.fixture(params=[5, 6], ids=["jetpack5", "jetpack6"])
def orin_kernel(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelTree]:
    """A fake Orin served over FUSE by a daemon that enforces the kernel's devfreq rules (min_freq <= max_freq,
    cur_freq under caps, read-only and EIO knobs): see testkit/fakes/kernelfs.py. DVFS_SYSFS_ROOT is the mount."""
    yield from _kernel_tree(tmp_path, monkeypatch, request.param)


@pytest.fixture
def orin6_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelTree]:
    yield from _kernel_tree(tmp_path, monkeypatch, 6)


@pytest.fixture
def kernel(orin: FakeJetson) -> FakeKernel:
    """The kernel's devfreq rules over the `orin` tree (JetsonDevice(writer=kernel.write))."""
    return FakeKernel(orin)


@pytest.fixture
def kernel6(orin6: FakeJetson) -> FakeKernel:
    return FakeKernel(orin6)


@pytest.fixture(autouse=True)
def _mlflow_follows_the_environment() -> Iterator[None]:
    """Every test starts and ends with MLflow's process-wide tracking URI unset, so its fluent API follows
    MLFLOW_TRACKING_URI: a test (or library code it calls) that sets the URI must not send a later test's runs to
    its own store. Nothing is imported here that the test did not import."""
    def unset() -> None:
        utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
        if utils is not None:
            utils._tracking_uri = None

    saved = os.environ.get("MLFLOW_TRACKING_URI")  # mlflow.set_tracking_uri writes the variable too
    unset()
    yield
    unset()
    if saved is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = saved


@functools.cache
def migrated_store_template() -> Path:
    """An empty MLflow SQLite store, its schema already migrated, made once per test run (`run_dir()`, shared by every
    xdist worker): creating one costs ~2.5 s of CPU (MLflow's migrations; 8-13 s on a loaded machine) plus a fresh
    interpreter, copying this one ~0.05 s. Made by a fresh process in its own folder, so nothing of it (the Default
    experiment's artifact location included) points at the checkout."""
    def make(folder: Path) -> None:
        code = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(tracking_uri=sys.argv[1]).search_experiments()"
        subprocess.run([sys.executable, "-c", code, f"sqlite:///{folder / 'mlflow.db'}"], cwd=folder, check=True, capture_output=True,
                       timeout=300)

    return _made_once("store-template", make) / "mlflow.db"


@pytest.fixture(scope="session")
def store_template() -> Path:
    """`migrated_store_template()`: copy it, never write to it."""
    return migrated_store_template()


@pytest.fixture
def empty_store(tmp_path: Path, store_template: Path) -> str:
    """A fresh, empty SQLite store of this test's own (a copy of `store_template`): its tracking URI."""
    db = tmp_path / "mlflow.db"
    shutil.copy2(store_template, db)
    return f"sqlite:///{db}"


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, process: bool = False) -> subprocess.CompletedProcess[str]:
    """`dvfs-mlops ARGS` with `env` over this process's environment, from the checkout: its exit code, stdout, stderr.

    In this process by default (click's CliRunner): a new interpreter costs 3-6 s of CPU importing mlflow and torch,
    and the suite makes well over a hundred CLI calls. `process=True` where the test is about the process itself
    (its imports, warnings, signals, start-up time). The environment, working directory and MLflow's tracking URI
    are the call's own and put back after it; an exception that escapes the CLI is a traceback on stderr and exit
    code 1, as Python's would be, so "no traceback" assertions mean what they say. What a process would show and this
    does not: Python warnings (pytest records them) and WARNING log records (pytest's handlers take them), so a test
    that counts every stderr line, or looks for warnings, runs with `process=True`; `timeout` applies to processes
    only (pytest-timeout bounds the rest)."""
    merged = {**os.environ, **(env or {})}
    if process:
        return subprocess.run([sys.executable, "-m", "dvfs_mlops", *args], capture_output=True, text=True, env=merged,
                              timeout=timeout, cwd=REPO)
    return _cli_in_process(list(args), merged)


def _cli_in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import traceback

    from click.testing import CliRunner
    from mlflow.tracking._tracking_service import utils as tracking_utils

    from dvfs_mlops.app.cli import main

    saved_env, saved_cwd, saved_uri = dict(os.environ), os.getcwd(), tracking_utils._tracking_uri
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    try:
        result = CliRunner().invoke(main, args, prog_name="dvfs-mlops", catch_exceptions=True)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        tracking_utils._tracking_uri = saved_uri
    stderr, code = result.stderr, result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
        code = 1
    return subprocess.CompletedProcess(["dvfs-mlops", *args], code, result.stdout, stderr)


def production_store(root: Path, **env: str) -> dict[str, str]:
    """A SQLite store under `root` whose production governor is the published tree (bootstrap + promote); its env.
    A new store starts as a copy of the migrated template (`migrated_store_template`)."""
    if not (root / "mlflow.db").exists():
        shutil.copy2(migrated_store_template(), root / "mlflow.db")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db", **env}
    for args in (("registry", "bootstrap"), ("registry", "promote", "1")):
        r = run_cli(*args, env=env)
        assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return env


@pytest.fixture(scope="session")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This worker's warm interpreter (testkit/warm.py): `warm.command()` runs `dvfs-mlops` as a new process forked
    from one that has imported torch, transformers and mlflow already; `warm.path()` is a PATH whose `dvfs-mlops` and
    `mlflow` are those (for scripts and `mlflow run`). For tests whose subject is what the commands do, not how a
    fresh interpreter starts (those keep `sys.executable`)."""
    from testkit.warm import WarmInterpreter

    interpreter = WarmInterpreter.start(tmp_path_factory.mktemp("warm"))
    try:
        yield interpreter
    finally:
        interpreter.stop()


SMOKE_SWEEP_CMD = ["mlflow", "run", str(REPO), "-e", "sweep", "--env-manager", "local", "--experiment-name", "dvfs-sweep",
                   "-P", "preset=smoke", "-P", "twin_profile=sim-orin"]  # the default, named: the same sweep id as without it


@pytest.fixture(scope="session")
def smoke_sweep_master(tmp_path_factory: pytest.TempPathFactory, trace_cache_dir: Path, warm: Any) -> Path:
    """The smoke sweep made by `mlflow run . -e sweep` (its `mlflow` and `dvfs-mlops` warm), once per test run and
    shared by every xdist worker (a file lock; the first worker to ask makes it). Nobody writes to it: users take a
    copy (`smoke_sweep_copy`)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    master = shared / "smoke-sweep"
    with open(shared / "smoke-sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = master / "result.json"
        if not done.exists():
            shutil.rmtree(master, ignore_errors=True)
            master.mkdir()
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{master}/mlflow.db", "DVFS_CACHE_DIR": str(trace_cache_dir),
                   "DVFS_SYSTEM_STATE_PREFIX": str(master / "state"), "PATH": warm.path()}
            out = subprocess.run(SMOKE_SWEEP_CMD, env=env, capture_output=True, text=True, timeout=900, cwd=master)
            done.write_text(json.dumps({"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr}))
    return master


def smoke_sweep_copy(master: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    """Copy the shared smoke sweep's store into `dest` (its artifacts stay where the master's runs logged them);
    returns the `mlflow run` that made it."""
    made = json.loads((master / "result.json").read_text())
    assert made["returncode"] == 0, made["stderr"][-3000:]
    for name in ("mlflow.db", "mlflow.db-wal", "mlflow.db-shm"):
        if (master / name).exists():
            shutil.copy2(master / name, dest / name)
    return subprocess.CompletedProcess(SMOKE_SWEEP_CMD, made["returncode"], made["stdout"], made["stderr"])


@pytest.fixture(scope="session")
def fleet_pg() -> Iterator[Any]:
    """A real PostgreSQL on 127.0.0.1 (Debian's package, a throwaway cluster), shared by the session's fleet tests;
    skipped, saying why, where its binaries or the psycopg driver are missing."""
    from testkit.fakes.pgserver import Postgres, postgres_missing

    why = postgres_missing()
    if why:
        pytest.skip(why)
    pg = Postgres()
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture(scope="session")
def fleet_server(fleet_pg: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`mlflow server` on `fleet_pg` with a local artifact destination served through it (its first start migrates the
    schema: once per session). Tests give their runs their own experiment names."""
    from testkit.fakes.pgserver import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("fleet-server"), fleet_pg.uri)
    try:
        yield server
    finally:
        server.stop()


def trainer_args(out: Path, max_steps: int, **overrides: Any) -> Any:
    """The `TrainingArguments` of a user's tiny Trainer on the CPU: `max_steps` of batch 8 writing into `out`, with no
    checkpoints, logging, reports or progress bars; `overrides` on top (e.g. bf16=True, a save strategy)."""
    from transformers import TrainingArguments

    settings: dict[str, Any] = {"output_dir": str(out), "max_steps": max_steps, "per_device_train_batch_size": 8, "report_to": [],
                                "use_cpu": True, "save_strategy": "no", "logging_strategy": "no", "disable_tqdm": True}
    return TrainingArguments(**{**settings, **overrides})


def trainer_data(prepared: Any) -> tuple[Any, Callable[[list[dict[str, Any]]], dict[str, Any]]]:
    """A prepared workload's train split as a torch Dataset and its collate function: what a user's own Trainer is given."""
    import torch

    from dvfs_mlops.job.workloads.tokenizer import collate as pad

    class TrainSplit(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(prepared.train)

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = prepared.train.ids[i]
            return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": int(prepared.train.labels[i])}

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        ids, mask = pad([x["input_ids"] for x in items], prepared.encoder.pad_id)
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask), "labels": torch.tensor([x["labels"] for x in items])}

    return TrainSplit(), collate
