"""The published package: the wheel carries every package folder and the registry data (the top-level registry/
folder, mapped in as dvfs_mlops.registry_data), an editable and an installed copy read the same files, a missing
gates file is an error, the declared torch requirement admits the torch builds we support, and the installed CLI runs
the whole loop printing only what we print (no warnings, ANSI codes or progress-bar redraws; the UI link at the end)."""
from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from dvfs_mlops.errors import DvfsError

REPO = Path(__file__).resolve().parents[1]
DATA = ("governor.yaml", "baselines/paper-mlg.json")  # under registry/, installed as dvfs_mlops/registry_data/
# What NVIDIA ships for JetPack 6 (Python 3.10): pre-releases with a local version tag.
NVIDIA_JETPACK6_TORCH = ("2.3.0a0+ebedce2.nv24.4", "2.3.0a0+40ec155e58.nv24.05", "2.4.0a0+3bcc3cddb5.nv24.07",
                         "2.5.0a0+872d972e41.nv24.08")
# Not the source of a build: VCS data, environments, stores and caches.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "mlruns",
                                     "mlartifacts", "*.db", ".pytest_cache", ".ruff_cache", ".cache", "results")


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _torch_requirement():
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    (torch,) = [r for r in reqs if r.name == "torch"]
    return torch


# ---- the torch requirement ---------------------------------------------------------------------------------

def test_installed_torch_satisfies_the_requirement():
    import importlib.metadata

    req = _torch_requirement()
    installed = importlib.metadata.version("torch")
    # pip keeps an installed torch when specifier.contains(version, prereleases=True) (its resolver's rule)
    assert req.specifier.contains(installed, prereleases=True), (str(req), installed)


@pytest.mark.parametrize("version", NVIDIA_JETPACK6_TORCH)
def test_nvidia_jetpack6_torch_satisfies_the_requirement(version):
    """pip must keep NVIDIA's torch on a Jetson instead of replacing it with a PyPI build without Orin CUDA."""
    req = _torch_requirement()
    assert req.specifier.contains(version, prereleases=True), (str(req), version)


@pytest.mark.parametrize("version", ["2.2.0", "2.2.0a0+81ea7a4.nv24.01", "1.14.0a0+44dac51c.nv23.02"])
def test_torch_requirement_still_has_a_floor(version):
    """Pre-releases are admitted from 2.3.0a0 on, not every torch: older builds (JetPack 5's included) are refused."""
    assert not _torch_requirement().specifier.contains(version, prereleases=True), version


def test_no_jetson_extra_and_package_data_declared():
    project = _pyproject()
    assert "jetson" not in project["project"].get("optional-dependencies", {})  # jtop is never required
    tool = project["tool"]["setuptools"]
    assert tool["package-dir"] == {"dvfs_mlops.registry_data": "registry"}
    assert {"*.yaml", "baselines/*.json"} <= set(tool["package-data"]["dvfs_mlops.registry_data"])


def test_every_package_folder_is_declared():
    """pyproject.toml lists the packages by name (the registry mapping needs it): a new folder must join the list."""
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "dvfs_mlops").rglob("__init__.py")}
    assert set(_pyproject()["tool"]["setuptools"]["packages"]) == folders | {"dvfs_mlops.registry_data"}


# ---- registry data: where it lives and what a missing file does ------------------------------------------

def test_registry_data_is_the_top_level_folder(monkeypatch):
    """The checkout's install (editable) reads registry/ itself: one copy, no registry data inside the package tree."""
    import dvfs_mlops
    from dvfs_mlops.model.governor.policies import paper_tree
    from dvfs_mlops.settings import registry_dir

    monkeypatch.delenv("DVFS_REGISTRY_DIR", raising=False)
    assert registry_dir().resolve() == REPO / "registry"
    for rel in DATA:
        assert (REPO / "registry" / rel).is_file()
    assert paper_tree().policy["name"] == "paper-mlg"
    assert not (Path(dvfs_mlops.__file__).parent / "registry_data").exists()  # mapped, not copied


def test_registry_dir_override(tmp_path, monkeypatch):
    from dvfs_mlops.mlops import registry

    (tmp_path / "governor.yaml").write_text("name: other-governor\ngates: []\n")
    monkeypatch.setenv("DVFS_REGISTRY_DIR", str(tmp_path))
    cfg = registry.load_config()
    assert cfg.name == "other-governor" and cfg.gates == [] and cfg.production == "production"


@pytest.mark.parametrize("content, message", [
    (None, r"registry config \(promotion gates\) .*governor.yaml not found \(\$DVFS_REGISTRY_DIR=.* names a folder without it\)"),
    ("name: x\n", "has no 'gates:' list"),
    ("gates:\n  - name: nameless\n", "gate #1 has no 'metric:'"),
    ("gates: [unclosed\n", "cannot read registry config"),
    ("- just\n- a list\n", "has no 'gates:' list"),
])
def test_bad_or_missing_gates_file_is_an_error(tmp_path, monkeypatch, content, message):
    """Never "no gates": a promotion must not pass silently because governor.yaml is not where it should be."""
    from dvfs_mlops.mlops import registry

    if content is not None:
        (tmp_path / "governor.yaml").write_text(content)
    monkeypatch.setenv("DVFS_REGISTRY_DIR", str(tmp_path))
    with pytest.raises(DvfsError, match=message) as e:
        registry.load_config()
    assert "\n" not in str(e.value)


def test_missing_published_tree_is_an_error(tmp_path, monkeypatch):
    from dvfs_mlops.model.governor.policies import paper_tree

    monkeypatch.setenv("DVFS_REGISTRY_DIR", str(tmp_path))
    with pytest.raises(DvfsError, match=r"published tree .*paper-mlg.json not found"):
        paper_tree()


# ---- nothing points at the old locations -----------------------------------------------------------------

# The files a user or CI reads: entry points, scripts, docs, tests, benchmarks and the package itself.
_SCANNED = ("MLproject", "Makefile", "README.md", "pyproject.toml", "conda.yaml", "constraints.txt", ".ci", "scripts", "docs",
            "tests", "benchmarks", "dvfs_mlops")
_TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".cfg", ".sh", ""}


def _scanned_files():
    for name in _SCANNED:
        top = REPO / name
        files = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for f in files:
            if f.is_file() and f.suffix in _TEXT and "__pycache__" not in f.parts:
                yield f


def test_nothing_refers_to_registry_data_inside_the_package_or_to_shared():
    """The registry data is registry/ (one copy); tests and docs never need files beside the checkout."""
    import re

    # the package folder it lived in before, as a path: dvfs_mlops/registry_data/
    old_registry = re.compile("dvfs_mlops" + "/" + "registry_data")
    shared = re.compile(r"\.\./" + "shared" + r"|parents\[2\]\s*/\s*['\"]" + "shared")
    hits = []
    for f in _scanned_files():
        rel = f.relative_to(REPO).as_posix()
        for lineno, line in enumerate(f.read_text(errors="replace").splitlines(), start=1):
            if old_registry.search(line) and rel != "tests/test_packaging.py":  # the wheel's own path, checked here
                hits.append(f"{rel}:{lineno}: {line.strip()}")
            if shared.search(line) and rel != ".ci/run":  # only CI may point DVFS_GLUE_SAMPLES there
                hits.append(f"{rel}:{lineno}: {line.strip()}")
    assert not hits, "\n".join(hits)


# ---- the wheel, built and installed ----------------------------------------------------------------------

def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _tail(r: subprocess.CompletedProcess[str]) -> str:
    return f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of the source (no build/ or egg-info left in the checkout)."""
    try:
        import setuptools
        from packaging.version import Version
    except ModuleNotFoundError as e:
        pytest.fail(f"building the wheel offline needs {e.name} in the test environment (pip install -e '.[dev]')")
    assert Version(setuptools.__version__) >= Version("70.1"), f"setuptools {setuptools.__version__} < 70.1 (the dev extra asks for it)"
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCE, symlinks=True)
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
              "-w", str(tmp / "dist"), str(src)], timeout=240)
    assert r.returncode == 0, _tail(r)
    (whl,) = (tmp / "dist").glob("dvfs_mlops-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_carries_the_registry_data(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for rel in DATA:
            assert f"dvfs_mlops/registry_data/{rel}" in names, sorted(n for n in names if not n.endswith(".py"))
            assert z.read(f"dvfs_mlops/registry_data/{rel}") == (REPO / "registry" / rel).read_bytes()
        meta = email.message_from_bytes(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    # the package and its metadata only: no tests, benchmarks or a top-level registry folder
    assert {n.split("/")[0] for n in names} == {"dvfs_mlops", f"dvfs_mlops-{meta['Version']}.dist-info"}, sorted(names)
    assert "dvfs-mlops = dvfs_mlops.app.cli:main" in entry_points
    assert "jetson" not in (meta.get_all("Provides-Extra") or [])
    requires = meta.get_all("Requires-Dist") or []
    assert str(_torch_requirement()) in requires and not [r for r in requires if "jetson-stats" in r]


def _fresh_venv(root: Path) -> Path:
    """A venv without pip whose only extra path is this environment's site-packages (for the dependencies).

    A plain path line in a .pth file is appended to sys.path without processing the .pth files found there,
    so this environment's editable-install hook is not run and the new venv's own copy of dvfs_mlops wins.
    """
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(root)], timeout=120)
    assert r.returncode == 0, _tail(r)
    py = root / "bin" / "python"
    r = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
    assert r.returncode == 0, _tail(r)
    here = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(r.stdout.strip()) / "_dvfs_test_dependencies.pth").write_text("".join(f"{p}\n" for p in here))
    return py


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """`pip install --no-deps` of the wheel (not editable) into a fresh venv; returns the venv."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    py = _fresh_venv(venv)
    r = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "--no-compile", "-q",
              str(wheel)], timeout=240)
    assert r.returncode == 0, _tail(r)
    assert (venv / "bin" / "dvfs-mlops").is_file()
    return venv


def _runner(venv: Path, tmp_path: Path):
    """Run the installed copy from outside the checkout, with its own tracking store."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    drop = ("PYTHONPATH", "PYTHONHOME", "DVFS_REGISTRY_DIR", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
    env = {k: v for k, v in os.environ.items() if k not in drop}  # DVFS_STATE_DIR etc. come from conftest
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db", PYTHONNOUSERSITE="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")

    def run(*args: str, extra: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        exe = str(venv / "bin" / args[0]) if args[0] in ("python", "dvfs-mlops") else args[0]
        return _run([exe, *args[1:]], cwd=work, env={**env, **(extra or {})}, timeout=timeout)

    return run


@pytest.mark.slow
def test_installed_copy_finds_its_registry_data(installed, tmp_path):
    run = _runner(installed, tmp_path)
    probe = ("import json, dvfs_mlops\n"
             "from dvfs_mlops.model.governor.policies import paper_tree\nfrom dvfs_mlops.settings import registry_dir\n"
             "from dvfs_mlops.mlops.registry import load_config\n"
             "print(json.dumps({'file': dvfs_mlops.__file__, 'registry': str(registry_dir()), 'tree': paper_tree().policy['name'],\n"
             "                  'gates': [g['name'] for g in load_config().gates]}))\n")
    r = run("python", "-c", probe)
    assert r.returncode == 0, _tail(r)
    where = json.loads(r.stdout.strip().splitlines()[-1])
    site = installed.resolve()
    assert Path(where["file"]).resolve().is_relative_to(site), where  # the installed copy, not the checkout
    assert Path(where["registry"]).resolve().is_relative_to(site) and where["tree"] == "paper-mlg", where
    assert where["gates"] == ["regret-no-worse-than-production", "heldout-regret", "beats-ffg", "uses-features",
                              "calibrated-no-worse-than-source", "calibrated-regret", "calibrated-not-over-trained"], where


# Noise a user must never see in the loop's output: warnings, ANSI colour codes, progress-bar redraws, tracebacks.
NOISE = re.compile(r"Warning|warnings\.warn|\x1b|\r|Traceback")
LOCAL_LINK = re.compile(r"^then open: (http://127\.0\.0\.1:5000/#/\S+)$")


def _noise(name: str, r: subprocess.CompletedProcess[str]) -> list[str]:
    return [f"{name}: {line!r}" for line in (r.stdout + r.stderr).split("\n") if NOISE.search(line)]


def _link(name: str, r: subprocess.CompletedProcess[str], store: str) -> str:
    """The last two stdout lines: the command that starts the UI on this store, then the link."""
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) >= 2 and lines[-2] == f"start the MLflow UI: mlflow ui --backend-store-uri {store}", (name, lines[-3:])
    m = LOCAL_LINK.match(lines[-1])
    assert m, (name, lines[-1])
    return m.group(1)


@pytest.mark.slow
def test_installed_loop_runs_through_the_gates_and_prints_only_what_we_print(installed, tmp_path):
    """The loop as `make run` runs it, on the installed CLI, each command a fresh process (import-time warnings are a
    process's): bootstrap, a tiny sim sweep through the MLproject (`mlflow run -P ...`, as scripts/main-job does),
    train, promote through the gates, finetune, evaluate. Every command prints no warning, ANSI code, progress-bar
    redraw or traceback, and each one that writes runs ends with the MLflow UI deep link to open."""
    from mlflow.tracking import MlflowClient

    run = _runner(installed, tmp_path)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    noise: list[str] = []
    r = run("dvfs-mlops", "registry", "bootstrap")
    assert r.returncode == 0 and "registered the published tree as dvfs-governor v1" in r.stdout, _tail(r)
    noise += _noise("bootstrap", r)

    # the sweep through the MLproject: its `dvfs-mlops` is the installed one (first on PATH); 2 models x sst2/mrpc
    # (the 4 training workloads cross-validation needs) + rte (held out) at 510 MHz + maxn, 1 step each
    mlflow = str(Path(sys.executable).parent / "mlflow")
    r = run(mlflow, "run", str(REPO), "-e", "sweep", "--env-manager", "local", "--experiment-name", "dvfs-sweep", "-P", "preset=smoke",
            "-P", "freqs=510", "-P", "steps=1", "-P", "train_size=32", "-P", "dev_size=16", "-P", "device=sim", timeout=300)
    assert r.returncode == 0, _tail(r)
    noise += _noise("sweep", r)
    link = _link("sweep", r, store)
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs\?workflowType=machine_learning", link), link

    r = run("dvfs-mlops", "train", "--trials", "2")
    assert r.returncode == 0 and "registered dvfs-governor v2" in r.stdout, _tail(r)
    noise += _noise("train", r)
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/models/dvfs-governor/versions/2\?workflowType=machine_learning",
                        _link("train", r, store))

    # one clock leaves a tiny sweep's governor no room to beat FFG strictly: the gates run (read from the installed
    # governor.yaml), and --force is what promotes such a version
    r = run("dvfs-mlops", "registry", "promote", "2", "--force")
    assert r.returncode == 0, _tail(r)
    for gate in ("regret-no-worse-than-production", "heldout-regret", "beats-ffg", "uses-features"):
        assert f"{gate}:" in r.stdout, r.stdout
    assert "production -> v2" in r.stdout, r.stdout
    noise += _noise("promote", r)
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/models/dvfs-governor/versions/2\?workflowType=machine_learning",
                        _link("promote", r, store))

    r = run("dvfs-mlops", "finetune", "--model", "bert-tiny", "--task", "rte", "--device", "sim", "--steps", "1", "--probe-steps", "1",
            "--train-size", "32", timeout=240)
    assert r.returncode == 0, _tail(r)
    noise += _noise("finetune", r)
    link = _link("finetune", r, store)
    m = re.fullmatch(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/([0-9a-f]{32})\?workflowType=machine_learning", link)
    assert m, link
    tags = MlflowClient(tracking_uri=store).get_run(m.group(1)).data.tags  # the production version it promoted decided
    assert (tags["governor.version"], tags["governor.alias"]) == ("2", "production"), tags

    r = run("dvfs-mlops", "evaluate")
    assert r.returncode == 0, _tail(r)
    noise += _noise("evaluate", r)
    assert re.fullmatch(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning",
                        _link("evaluate", r, store))
    assert noise == [], "\n".join(noise)

    # no gates file: one clear line, never a silent "no gates"
    empty = tmp_path / "no-registry-data"
    empty.mkdir()
    r = run("dvfs-mlops", "registry", "promote", "1", extra={"DVFS_REGISTRY_DIR": str(empty)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, _tail(r)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "governor.yaml not found" in lines[0] and "DVFS_REGISTRY_DIR" in lines[0], lines
