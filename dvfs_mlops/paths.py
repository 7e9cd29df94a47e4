"""Where the package's data lives. Low level: the registry and the governor both read from here."""
from __future__ import annotations

import os
from pathlib import Path

from dvfs_mlops.errors import DvfsError

REGISTRY_DIR_ENV = "DVFS_REGISTRY_DIR"


def registry_dir() -> Path:
    """The registry data: `dvfs_mlops/registry_data/` inside the installed package ($DVFS_REGISTRY_DIR overrides).

    It holds governor.yaml (name, aliases, promotion gates) and baselines/paper-mlg.json (the published tree).
    """
    env = os.environ.get(REGISTRY_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parent / "registry_data"


def registry_file(*parts: str, what: str) -> Path:
    """A file of the registry data, or a one-line error naming where it was looked for."""
    path = registry_dir().joinpath(*parts)
    if not path.is_file():
        env = os.environ.get(REGISTRY_DIR_ENV)
        why = (f"${REGISTRY_DIR_ENV}={env} names a folder without it" if env
               else "the package's registry data is missing; reinstall dvfs-mlops")
        raise DvfsError(f"{what} {path} not found ({why})")
    return path
