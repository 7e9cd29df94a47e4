"""A resolved governor, remembered between decisions while its SQLite store has not been written.

Importing MLflow and opening its SQLAlchemy store is most of a decision's time (`python -m benchmarks
decision` measures it). What
`models:/name@alias` resolves to can change only when the store is written, and for a `sqlite:///`
store a write is visible from the file system. So the launcher keeps what its last resolution found
(version, alias, tags, policy.json) with a stamp of the database files (size, mtime_ns, inode and
ctime_ns of the `.db`, and of any `-wal` or `-journal` beside it). A decision whose stamp is
identical uses the entry and imports no MLflow; any write to the store (a promotion, a logged run)
changes the stamp, and the next decision asks MLflow again.

An entry is written only when the files did not change while MLflow was being asked (a promotion
racing the lookup leaves no entry), and only for a version whose code is this package's, byte for
byte (the launcher's direct-read rule); its key carries the digest of that code, so an upgraded
package misses. Any other store (an MLflow server, PostgreSQL) is always asked.
Entries live in `$DVFS_CACHE_DIR/workloads/governors/` (see `workloads/cache.py`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

from dvfs_mlops.job.workloads import cache

KIND = "governors"
_SIDE_FILES = ("", "-wal", "-journal")  # SQLite's rollback journal and write-ahead log change with every write


@dataclasses.dataclass(frozen=True)
class CachedGovernor:
    policy: dict[str, Any]
    meta: dict[str, Any]  # uri, name, version, alias, tags: as launcher.resolve_governor returns them


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI (relative paths from the working directory); None otherwise."""
    if not tracking_uri.startswith("sqlite:///") or "?" in tracking_uri:
        return None
    raw = tracking_uri[len("sqlite:///"):]
    if not raw or raw == ":memory:":
        return None
    return Path(raw).resolve()


def store_stamp(tracking_uri: str) -> list[list[int] | None] | None:
    """What changes whenever the SQLite store is written; None for other stores or a missing database."""
    db = sqlite_path(tracking_uri)
    if db is None or not db.is_file():
        return None
    stamp: list[list[int] | None] = []
    for suffix in _SIDE_FILES:
        try:
            st = os.stat(f"{db}{suffix}")
        except FileNotFoundError:
            stamp.append(None)
            continue
        stamp.append([st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return stamp


def _key(tracking_uri: str, target: str) -> str | None:
    db = sqlite_path(tracking_uri)
    if db is None:
        return None
    from dvfs_mlops.mlops.pyfunc import CODE, TREE_CODE  # the files a version's code is compared with

    code = cache.digest([hashlib.sha256(CODE.read_bytes()).hexdigest(), hashlib.sha256(TREE_CODE.read_bytes()).hexdigest()])
    return cache.digest({"db": str(db), "target": target, "code": code})


def lookup(tracking_uri: str, target: str) -> CachedGovernor | None:
    """The governor `target` resolved to last time, if the store has not been written since; else None."""
    key = _key(tracking_uri, target)
    if key is None:
        return None
    entry = cache.read(KIND, key)
    if entry is None or entry.get("stamp") != store_stamp(tracking_uri):
        return None
    policy, meta = entry.get("policy"), entry.get("meta")
    if not isinstance(policy, dict) or not isinstance(meta, dict):
        return None
    return CachedGovernor(policy, meta)


def remember(tracking_uri: str, target: str, stamp_before: list[list[int] | None] | None, found: CachedGovernor) -> bool:
    """Keep `found` for `target` if the store's stamp now is `stamp_before` (nothing was written meanwhile)."""
    key = _key(tracking_uri, target)
    if key is None or stamp_before is None or store_stamp(tracking_uri) != stamp_before:
        return False
    cache.write(KIND, key, {"stamp": stamp_before, "policy": found.policy, "meta": found.meta},
                described={"db": str(sqlite_path(tracking_uri)), "target": target})
    return True
