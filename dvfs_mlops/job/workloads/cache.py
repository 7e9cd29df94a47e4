"""Small on-disk caches of what a decision needs, so a warm `finetune --dry-run` imports neither torch nor transformers.

Three kinds, each a folder of JSON files named by a content key (sha256 of what the value depends on):
`models` (a config's encoder/decoder type, layer count, hidden size and trainable parameter count,
counted once on the meta device), `lengths` (the tokenised lengths of a task's training split, keyed
by task, data source and its inputs, tokenizer and split) and `traces` (which twin step trace a
workload's classifier config maps to, for a torch and transformers version). Every key carries the
versions of the libraries and a digest of the source files that produce the value, so a changed
input, library or producing code is a miss, never a stale hit.
`plots.py` keeps drawn sweep figures (PNG) under `figures/` with the same keys (`digest`, `code_digest`).

Location: the twin's trace cache convention. `$DVFS_CACHE_DIR/workloads/<kind>/` when that is set
(the traces themselves are in `$DVFS_CACHE_DIR`), else `~/.cache/dvfs-mlops/workloads/<kind>/`
(beside `~/.cache/dvfs-mlops/traces`). An unreadable or corrupt entry is a miss; a cache that
cannot be written is logged and skipped, never an error.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings

log = logging.getLogger(__name__)

CACHE_FORMAT = 1


def cache_dir(kind: str) -> Path:
    return settings.cache_root() / "workloads" / kind


def digest(obj: object, n: int = 24) -> str:
    """A stable hex key of a JSON-able value."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


@functools.cache
def dist_version(name: str) -> str:
    """An installed distribution's version, read from its metadata (importing nothing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


@functools.cache
def code_digest(*modules: str) -> str:
    """A digest of the source of the named modules of this package (`job.workloads.synthetic`, ...)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for m in modules:
        path = root.joinpath(*m.split(".")).with_suffix(".py")
        h.update(m.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read(kind: str, key: str) -> dict[str, Any] | None:
    """The entry stored under `key`, or None (absent, unreadable, another format, or written for another key)."""
    path = cache_dir(kind) / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("key") != key:
        return None
    value = data.get("value")
    return value if isinstance(value, dict) else None


def _replace_atomically(path: Path, fill: Callable[[Path], object]) -> None:
    """Write `path` through a temporary file beside it, renamed over it: a reader never sees half an entry, and a
    write that fails leaves no temporary file behind. OSError goes to the caller."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        fill(tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write(kind: str, key: str, value: dict[str, Any], described: dict[str, Any] | None = None) -> None:
    """Store `value` under `key` atomically; `described` (what the key was made of) is kept for people reading the file."""
    path = cache_dir(kind) / f"{key}.json"
    blob = json.dumps({"format": CACHE_FORMAT, "key": key, "of": described, "value": value}, default=str)
    try:
        _replace_atomically(path, lambda tmp: tmp.write_text(blob))
    except OSError as e:
        log.warning("could not write the %s cache entry %s (%s); the next decision computes it again", kind, path, e)


def store_file(kind: str, name: str, source: Path) -> None:
    """Keep a copy of `source` in the cache as `name`, atomically (a figure, say); a cache that cannot be written is
    skipped, logged at debug level: the file itself was made, only its reuse is lost."""
    path = cache_dir(kind) / name
    try:
        _replace_atomically(path, lambda tmp: shutil.copyfile(source, tmp))
    except OSError as e:
        log.debug("could not keep %s in the %s cache (%s)", source.name, kind, e)
