"""The sysfs root every Jetson path is read under (`$DVFS_SYSFS_ROOT`, default `/`), and a clean read."""
from __future__ import annotations

from pathlib import Path

from dvfs_mlops import settings


def sysfs_root() -> Path:
    return settings.sysfs_root()


def read_sysfs(path: Path) -> str:
    """A sysfs text file without its trailing newline or NUL bytes."""
    return path.read_text().replace("\x00", "").strip()


def write_sysfs(path: Path, value: str) -> None:
    """Write `value` to a sysfs (or debugfs) file in one write(2), as the kernel's store callbacks expect."""
    with open(path, "w") as f:
        f.write(value)
