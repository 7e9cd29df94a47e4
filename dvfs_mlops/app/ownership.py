"""Under sudo, files a command creates in the user's tree go back to the user who ran sudo.

`sudo dvfs-mlops ...` (still supported beside the clock service) runs as root, so the MLflow store, its artifacts,
Optuna's database and the caches it creates in the user's folders would be root's, and the user's next
unprivileged command would find them read-only. After each command (`after_command`, called by the CLI once the
command ends, however it ends) every root-owned entry in the user's tree that the command may have made is chowned to
$SUDO_UID:$SUDO_GID: new entries of the working directory and of the SQLite tracking store's folder (mlflow.db,
optuna.db, the claims table, mlruns/, mlartifacts/) and the cache folder. "The user's tree" is a folder the user
owns: nothing is given away in a folder of root's or someone else's, and only root's own entries change hands.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from dvfs_mlops import settings

log = logging.getLogger(__name__)

TREES = ("mlruns", "mlartifacts")  # MLflow's file store and artifact folders: given back whole, whenever created


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def _sqlite_folder(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).absolute().parent


def _chown_tree(top: Path, uid: int, gid: int) -> list[Path]:
    """Give root's entries under `top` (itself included, links not followed) to uid:gid."""
    changed: list[Path] = []
    paths = [top]
    if top.is_dir() and not top.is_symlink():
        for d, dirs, files in os.walk(top):
            paths += [Path(d) / n for n in [*dirs, *files]]
    for p in paths:
        if _owner(p) == 0:
            with contextlib.suppress(OSError):
                os.lchown(p, uid, gid)
                changed.append(p)
    return changed


def give_back(since: float, uid: int, gid: int, folders: list[Path], cache: Path) -> list[Path]:
    """Chown to uid:gid what a command running as root made in folders `uid` owns.

    Args:
        since: when the command started: in `folders`, only entries changed since are given back (besides `TREES`).
        uid: the user to give them to. gid: their group.
        folders: folders the command writes in (the working directory, the tracking store's); skipped unless `uid` owns
            them.
        cache: the cache folder: given back whole where it or its parent is `uid`'s.

    Returns:
        The paths whose owner changed.
    """
    changed: list[Path] = []
    for folder in dict.fromkeys(folders):
        if _owner(folder) != uid:
            continue
        for entry in folder.iterdir():
            if entry.name in TREES or (_owner(entry) == 0 and entry.lstat().st_ctime >= since):
                changed += _chown_tree(entry, uid, gid)
    if cache.exists() and uid in (_owner(cache), _owner(cache.parent)):
        changed += _chown_tree(cache, uid, gid)
    return changed


def after_command() -> Callable[[], None]:
    """What the CLI calls when a command ends: under sudo, give the user's files back (`give_back`); else nothing."""
    started = time.time() - 1.0  # ctime has the file system's granularity

    def give_back_now() -> None:
        ids = settings.sudo_ids()
        if os.geteuid() != 0 or ids is None:
            return
        folders = [Path.cwd()]
        db = _sqlite_folder(settings.tracking_uri())
        if db is not None:
            folders.append(db)
        try:
            changed = give_back(started, *ids, folders, settings.cache_root())
        except OSError as e:  # never fail a command over it
            log.warning("could not give the files this command made back to uid %d: %s", ids[0], e)
            return
        if changed:
            log.info("gave %d file(s) made under sudo back to uid %d", len(changed), ids[0])

    return give_back_now
