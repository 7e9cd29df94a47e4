"""The sysfs root every Jetson path is read under (`$DVFS_SYSFS_ROOT`, default `/`), and a clean read."""
from __future__ import annotations

import os
from pathlib import Path


def sysfs_root() -> Path:
    return Path(os.environ.get("DVFS_SYSFS_ROOT", "/"))


def read_sysfs(path: Path) -> str:
    """A sysfs text file without its trailing newline or NUL bytes."""
    return path.read_text().replace("\x00", "").strip()
