from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.sysfs import FakeJetson, make_orin_tree

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own journal/lock dir and never sees the real sysfs."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("DVFS_STATE_DIR", str(state))
    monkeypatch.setenv("DVFS_SYSFS_ROOT", str(tmp_path_factory.mktemp("empty-sysfs")))
    return state


@pytest.fixture(scope="session")
def trace_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step traces are shared by the whole run (capturing one costs ~0.1-1 s)."""
    return Path(os.environ.get("DVFS_TEST_TRACE_CACHE") or tmp_path_factory.mktemp("traces"))


@pytest.fixture(autouse=True)
def _trace_cache_env(trace_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DVFS_CACHE_DIR", str(trace_cache_dir))


@pytest.fixture
def state_dir() -> Path:
    return Path(os.environ["DVFS_STATE_DIR"])


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


@pytest.fixture
def devfreq_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Enforce the kernel's devfreq rule (min_freq <= max_freq after every write) and log writes."""
    from dvfs_mlops.device.jetson import JetsonDevice
    from dvfs_mlops.errors import DvfsError

    log: list[tuple[str, int]] = []
    original = JetsonDevice._write

    def checked(self: JetsonDevice, name: str, value: str) -> None:
        if name in ("min_freq", "max_freq"):
            lo, hi = self.current_range_hz()
            lo, hi = (int(value), hi) if name == "min_freq" else (lo, int(value))
            if lo > hi:
                raise DvfsError(f"kernel: EINVAL writing {name}={value} (min {lo} > max {hi})")
            log.append((name, int(value)))
        original(self, name, value)

    monkeypatch.setattr(JetsonDevice, "_write", checked)
    return log


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvfs_mlops.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=REPO)
