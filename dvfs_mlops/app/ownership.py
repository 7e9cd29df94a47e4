"""Under sudo, files a command creates in the user's tree go back to the user who ran sudo, and nothing else does.

`sudo dvfs-mlops ...` (still supported beside the clock service) runs as root, so the MLflow store, its artifacts,
Optuna's database and the caches it creates in the user's folders would be root's, and the user's next
unprivileged command would find them read-only. When the command starts (`after_command`, called by the CLI), each
folder it writes in (the working directory, the SQLite tracking store's folder, the way to the cache folder) is opened
once, checked to be the user's, and what root already owns in it is recorded; when it ends, however it ends, root's
entries that appeared since (and MLflow's `TREES`, whole) are given to $SUDO_UID:$SUDO_GID.

Everything is done through directory descriptors, never by path: the folders are the ones opened at the start, every
folder below is opened with O_NOFOLLOW|O_DIRECTORY relative to its parent's descriptor and checked to be the entry
just listed, and each file is changed through its own descriptor (fchown) after checking it is a regular file with
one link (a hard link to a file elsewhere is never given). A symbolic link is never followed (a link itself root
made is given back as a link), so a folder the user swaps for a link to a root folder, at any moment, hands back
nothing outside the user's tree. (Dropping to the user's fsuid before creating files would do it without a walk, but
the same command writes clocks and root-only state folders, which need fsuid 0.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dvfs_mlops import settings

log = logging.getLogger(__name__)

TREES = ("mlruns", "mlartifacts")  # MLflow's file store and artifact folders: given back whole, whenever created
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _sqlite_folder(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).absolute().parent


def _open_folder(path: Path) -> int | None:
    """`path` opened from / without following a link anywhere (its real path as resolved now), or None."""
    real = Path(os.path.realpath(path))
    try:
        fd = os.open("/", _DIR)
    except OSError:
        return None
    for name in real.parts[1:]:
        try:
            child = os.open(name, _DIR, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd


@dataclasses.dataclass
class _Watched:
    """A folder of the user's, opened when the command started.

    Attributes:
        fd: its descriptor. path: its path then (for messages).
        before: (device, inode) of root's entries in it then: not this command's doing.
        only: the relative way to the one entry to give back whole (the cache folder), or () for every new entry.
        whole: every entry of root's in it, new or not (the cache folder itself).
    """

    fd: int
    path: Path
    before: set[tuple[int, int]]
    only: tuple[str, ...] = ()
    whole: bool = False


class HandBack:
    """What a command run as root makes in folders of `uid`'s, given back to uid:gid when it ends.

    Args:
        uid: the user to give them to. gid: their group.
        folders: folders the command writes in (the working directory, the tracking store's); skipped unless `uid`
            owns them. Their new root entries are given back, and `TREES` whole.
        cache: the cache folder: given back whole where it exists and is `uid`'s or in a folder of `uid`'s; where it does
            not exist yet, what the command makes on the way to it from its nearest folder of `uid`'s.
        since: when the command started (None: now); an entry changed before it is not the command's.
    """

    def __init__(self, uid: int, gid: int, folders: Sequence[Path], cache: Path, since: float | None = None):
        self.uid, self.gid = uid, gid
        self.since = time.time() - 1.0 if since is None else since  # ctime has the file system's granularity
        self._watched: list[_Watched] = []
        for folder in dict.fromkeys(folders):
            self._watch(folder, ())
        self._watch_cache(cache)

    def _watch(self, folder: Path, only: tuple[str, ...], whole: bool = False) -> None:
        fd = _open_folder(folder)
        if fd is None:
            return
        if os.fstat(fd).st_uid != self.uid:
            os.close(fd)
            return
        before: set[tuple[int, int]] = set()
        with contextlib.suppress(OSError):
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if st.st_uid == 0:
                        before.add((st.st_dev, st.st_ino))
        self._watched.append(_Watched(fd, folder, before, only, whole))

    def _watch_cache(self, cache: Path) -> None:
        """The cache: whole where it is the user's; where it is root's in a folder of the user's, or missing, the way to
        it from the nearest existing folder (`_watch` skips one that is not the user's)."""
        cache = Path(os.path.abspath(cache))
        if _owner(cache) == self.uid:
            self._watch(cache, (), whole=True)
            return
        top = cache.parent
        while not top.exists() and top != top.parent:
            top = top.parent
        self._watch(top, cache.relative_to(top).parts)

    def finish(self) -> list[Path]:
        """Give back what the command made (module doc); close the folders.

        Returns:
            The paths (as they were reached) whose owner changed.
        """
        changed: list[Path] = []
        for w in self._watched:
            try:
                if w.only:
                    self._give_way(w, changed)
                else:
                    for name in sorted(os.listdir(w.fd)):
                        if w.whole:
                            self._give_tree(w.fd, name, w.path / name, changed)
                        else:
                            self._give_new(w, name, changed)
            except OSError as e:  # never fail a command over it
                log.warning("could not give back what this command made in %s to uid %d: %s", w.path, self.uid, e)
            finally:
                os.close(w.fd)
        self._watched = []
        return changed

    def _give_new(self, w: _Watched, name: str, changed: list[Path]) -> None:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(name, dir_fd=w.fd, follow_symlinks=False)
            if name in TREES or (st.st_uid == 0 and (st.st_dev, st.st_ino) not in w.before and st.st_ctime >= self.since):
                self._give_tree(w.fd, name, w.path / name, changed)

    def _give_way(self, w: _Watched, changed: list[Path]) -> None:
        """Down `w.only` from `w.fd`: through the user's own folders; from the first of root's, everything below."""
        fd, path = os.dup(w.fd), w.path
        try:
            for i, name in enumerate(w.only):
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    return
                if st.st_uid == 0 or i == len(w.only) - 1:
                    self._give_tree(fd, name, path / name, changed)
                    return
                if not stat.S_ISDIR(st.st_mode):
                    return
                child = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd, path = child, path / name
        finally:
            os.close(fd)

    def _give_tree(self, parent: int, name: str, path: Path, changed: list[Path]) -> None:
        """Give root's entries at and below `name` in `parent`, each through its own descriptor; a folder after its
        entries, so nobody can change a folder of root's while it is walked."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid == 0:  # the link itself (fchownat AT_SYMLINK_NOFOLLOW), never what it points to
                os.chown(name, self.uid, self.gid, dir_fd=parent, follow_symlinks=False)
                changed.append(path)
            return
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return
        try:
            fd = os.open(name, _DIR if stat.S_ISDIR(st.st_mode) else _FILE, dir_fd=parent)
        except OSError:
            return  # swapped for a link, or gone: nothing
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return  # not the entry listed: swapped meanwhile
            if stat.S_ISDIR(now.st_mode):
                for child in sorted(os.listdir(fd)):
                    self._give_tree(fd, child, path / child, changed)
            elif now.st_nlink != 1:
                return  # a hard link: the same file is elsewhere too
            if now.st_uid == 0:
                os.fchown(fd, self.uid, self.gid)
                changed.append(path)
        finally:
            os.close(fd)


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def after_command() -> Callable[[], None]:
    """What the CLI calls when a command starts: under sudo, watch the user's folders now (`HandBack`) and return what
    gives the files back when the command ends; else a function that does nothing."""
    ids = settings.sudo_ids()
    if os.geteuid() != 0 or ids is None:
        return lambda: None
    folders = [Path.cwd()]
    db = _sqlite_folder(settings.tracking_uri())
    if db is not None:
        folders.append(db)
    try:
        hand_back = HandBack(*ids, folders, settings.cache_root())
    except OSError as e:  # never fail a command over it
        log.warning("could not watch the folders this command writes in for uid %d: %s", ids[0], e)
        return lambda: None

    def give_back_now() -> None:
        changed = hand_back.finish()
        if changed:
            log.info("gave %d file(s) made under sudo back to uid %d", len(changed), ids[0])

    return give_back_now
