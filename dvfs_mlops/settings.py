"""Every environment variable dvfs-mlops reads or sets, in one place, each with its default.

This is the only module that touches `os.environ`. Values are read when asked for, not at import, so a test or
a caller that sets a variable sees it take effect on the next call. `VARIABLES` lists each one with its default
and meaning (the docs site's environment page is checked against it). Standard library only.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from dvfs_mlops.errors import DvfsError


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default as the docs state it, and what it does."""

    name: str
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db", "the MLflow tracking store (a server, SQLite, PostgreSQL)"),
    Variable("MLFLOW_RUN_ID", "unset", "set by `mlflow run`: the run a command logs into (its parent run, for a sweep)"),
    Variable("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4", "MLflow client retries against a tracking server (set if unset)"),
    Variable("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1", "their backoff factor (set if unset)"),
    Variable("MLFLOW_HTTP_REQUEST_TIMEOUT", "30", "seconds per tracking request (set if unset)"),
    Variable("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true", "MLflow's own \"View run\"/\"View experiment\" lines per run "
             "against a tracking server, off (set if unset; a command ends with its own link)"),
    Variable("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false", "MLflow's upload bars, off in the CLI (set if unset)"),
    Variable("HF_HUB_DISABLE_PROGRESS_BARS", "1", "transformers' progress bars, off in the CLI (set if unset)"),
    Variable("DVFS_CLAIMS_URI", "unset", "where sweep workers claim points (postgresql://..., file:///..., tracking, none)"),
    Variable("DVFS_CACHE_DIR", "~/.cache/dvfs-mlops", "caches: step traces (its root) and workload facts (workloads/)"),
    Variable("DVFS_SYSTEM_STATE_PREFIX", "/", "the root the state folders (locks: run/dvfs-mlops/state, journals: "
             "var/lib/dvfs-mlops) and the clock service's config (etc/dvfs-mlops/clockd.conf) are under (tests, chroots)"),
    Variable("DVFS_SYSFS_ROOT", "/", "the root every sysfs path is read under (a fake tree, a chroot)"),
    Variable("DVFS_REGISTRY_DIR", "the installed registry data", "a folder with your own governor.yaml and baselines/"),
    Variable("DVFS_TORCH_DEVICE", "the backend's", "where training runs (as --torch-device; tests and unusual set-ups)"),
    Variable("DVFS_CLOCKD_SOCKET", "/run/dvfs-mlops/clockd.sock", "the clock service's socket: non-root sessions pin "
             "through it where it exists (`dvfs-mlops clockd`)"),
    Variable("SUDO_UID", "unset", "set by sudo (read, never set): files a command creates in the user's tree go back to "
             "this user"),
    Variable("SUDO_GID", "unset", "set by sudo (read, never set): the group those files go back to"),
    Variable("SUDO_USER", "unset", "set by sudo (read, never set): `clockd install` adds this user to the service's group"),
    Variable("CUDA_VISIBLE_DEVICES", "unset", "CUDA's own (read, never set): the GPUs torch sees; the nvml backend finds its "
             "GPU among them by UUID and names them in its error"),
    Variable("LOCAL_RANK", "unset", "set by torchrun / accelerate launch (read, never set): DvfsCallback pins and meters "
             "this process's GPU, the LOCAL_RANK-th the job sees"),
)

_DEFAULTS = {v.name: v.default for v in VARIABLES}
TRACKING_URI_DEFAULT = _DEFAULTS["MLFLOW_TRACKING_URI"]
REGISTRY_DIR_ENV = "DVFS_REGISTRY_DIR"
CLAIMS_ENV = "DVFS_CLAIMS_URI"
# Transient HTTP errors against a tracking server are retried by MLflow's client with exponential backoff; bounded
# (4 retries, factor 1: 1+2+4+8 s) so a dead server fails a point in seconds, not after MLflow's default of minutes.
MLFLOW_HTTP_DEFAULTS = {k: _DEFAULTS[k] for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                                                   "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")}
CLI_DEFAULTS = {k: _DEFAULTS[k] for k in ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "HF_HUB_DISABLE_PROGRESS_BARS")}


def _get(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None


def tracking_uri() -> str:
    """The MLflow tracking store: $MLFLOW_TRACKING_URI, else `sqlite:///mlflow.db` in the working directory."""
    return _get("MLFLOW_TRACKING_URI") or TRACKING_URI_DEFAULT


def mlflow_run_id() -> str | None:
    """The run `mlflow run` started for this command ($MLFLOW_RUN_ID), or None."""
    return _get("MLFLOW_RUN_ID")


def claims_uri() -> str:
    """$DVFS_CLAIMS_URI, '' when unset."""
    return _get(CLAIMS_ENV) or ""


def cache_root() -> Path:
    """$DVFS_CACHE_DIR, else ~/.cache/dvfs-mlops."""
    base = _get("DVFS_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "dvfs-mlops"


def trace_cache_dir() -> Path:
    """Where step traces are cached: $DVFS_CACHE_DIR itself, else ~/.cache/dvfs-mlops/traces."""
    base = _get("DVFS_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "dvfs-mlops" / "traces"


def system_state_prefix() -> Path:
    """The root the state folders and the clock service's config are under: $DVFS_SYSTEM_STATE_PREFIX, else /."""
    return Path(_get("DVFS_SYSTEM_STATE_PREFIX") or "/")


def sysfs_root() -> Path:
    """The root every sysfs path is read under: $DVFS_SYSFS_ROOT, else /."""
    return Path(_get("DVFS_SYSFS_ROOT") or "/")


CLOCKD_SOCKET_DEFAULT = _DEFAULTS["DVFS_CLOCKD_SOCKET"]


def clockd_socket() -> Path:
    """The clock service's socket: $DVFS_CLOCKD_SOCKET, else /run/dvfs-mlops/clockd.sock."""
    return Path(_get("DVFS_CLOCKD_SOCKET") or CLOCKD_SOCKET_DEFAULT)


def sudo_ids() -> tuple[int, int] | None:
    """(uid, gid) of the user who ran sudo ($SUDO_UID, $SUDO_GID), None when not under sudo (or not numbers)."""
    uid, gid = _get("SUDO_UID"), _get("SUDO_GID")
    if uid is None or gid is None or not (uid.isdigit() and gid.isdigit()):
        return None
    return int(uid), int(gid)


def sudo_user() -> str | None:
    """The name of the user who ran sudo ($SUDO_USER), None when not under sudo."""
    return _get("SUDO_USER")


def torch_device_override() -> str | None:
    """$DVFS_TORCH_DEVICE, or None."""
    return _get("DVFS_TORCH_DEVICE")


def cuda_visible_devices() -> str | None:
    """$CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU visible), '' when set empty (none visible)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def local_rank() -> int | None:
    """$LOCAL_RANK (a launcher's process number on this machine: torchrun, accelerate launch), None when unset.

    Raises:
        DvfsError: set but not a whole number.
    """
    value = _get("LOCAL_RANK")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise DvfsError(f"LOCAL_RANK={value!r} is not a process number; it is set by torchrun/accelerate launch, leave it to them")
    return int(value)


def registry_dir() -> Path:
    """The registry data (governor.yaml, baselines/): $DVFS_REGISTRY_DIR, else the package's `dvfs_mlops.registry_data`.

    That package is the repository's top-level `registry/` folder, mapped into the package by pyproject.toml: an
    editable install reads the folder itself, a wheel its installed copy of the same files.
    """
    env = _get(REGISTRY_DIR_ENV)
    if env:
        return Path(env)
    import importlib.util

    spec = importlib.util.find_spec("dvfs_mlops.registry_data")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DvfsError("the package's registry data (dvfs_mlops.registry_data) is missing; reinstall dvfs-mlops")
    return Path(locations[0])


def registry_file(*parts: str, what: str) -> Path:
    """A file of the registry data.

    Raises:
        DvfsError: the file is missing; the message names where it was looked for and why.
    """
    path = registry_dir().joinpath(*parts)
    if not path.is_file():
        env = _get(REGISTRY_DIR_ENV)
        why = (f"${REGISTRY_DIR_ENV}={env} names a folder without it" if env
               else "the package's registry data is missing; reinstall dvfs-mlops")
        raise DvfsError(f"{what} {path} not found ({why})")
    return path


def set_defaults(defaults: Mapping[str, str]) -> None:
    """Set each variable that is unset (a user's own value always wins)."""
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def overridden(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` for the block, then put back what was there (e.g. few retries for a reachability check)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
