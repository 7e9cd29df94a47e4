"""Safety around clock writes: a single-owner lock, a restore journal, and signal handling.

- Where: locks in /run/dvfs-mlops/state, journals in /var/lib/dvfs-mlops, for every process that writes a clock
  itself (root's sessions, the clock service, `sudo`), so one owner per clock domain holds whoever pins. Both folders
  are the writer's own, mode 0700, and every file in them 0600. ($DVFS_SYSTEM_STATE_PREFIX puts both under another
  root: tests and chroots.) A user other than root cannot reach them: such a user pins through the clock service, or
  is refused in one line; a per-user folder never holds the lock of a system-wide resource.
- How they are opened: from / one component at a time, each folder with O_NOFOLLOW|O_DIRECTORY relative to the one
  before (`open_private_dir`), every file with O_NOFOLLOW|O_CLOEXEC relative to its folder; a folder on the way must
  be root's (or the writer's) and writable by nobody else unless it is a sticky folder of root's (/tmp); the state
  folder itself must be the writer's own with no group or other bits. A symbolic link anywhere, another owner or a
  loose mode refuses that one operation in one line (`StateFolderError`) and is logged; nothing is followed, truncated
  or created there. Nothing is written in /run/lock or any other world-writable folder.
- Lock: `lock-<device>.pid`, held with `flock`, so the kernel drops it when the owner dies (even by SIGKILL): a stale
  lock is taken over without guessing. The file holds the owner's PID for the "busy" message; being 0600 in a 0700
  folder, nobody else can open it to hold a lock of their own.
- Journal: `restore-<device>.json`, written (to a fresh 0600 file, fsync'd, renamed into place) before the first clock
  write, removed only after a successful restore: a failed restore keeps it (and releases the lock), so
  `dvfs-mlops restore` can finish the job once the cause is fixed. A journal whose owner is dead means a killed run
  left clocks pinned: `dvfs-mlops restore` (or the next session, automatically) puts them back.
- Boot id: a journal records the kernel's boot id. One written in an earlier boot is not applied (the reboot already
  reset the clocks, and applying it would override the power mode set since): it is removed with one log line.
- Signals: inside a session SIGTERM and SIGHUP raise `SystemExit`, so `with` blocks unwind and
  restore exactly as they do for exceptions and Ctrl-C.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DeviceBusyError, DevicePermissionError, RestoreFailedError, StateFolderError

_CAUGHT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

logger = logging.getLogger(__name__)


SYSTEM_LOCK_DIR = "run/dvfs-mlops/state"
SYSTEM_JOURNAL_DIR = "var/lib/dvfs-mlops"
# The kernel's boot id: "a UUID generated the first time this is retrieved, and unvarying after that"
# (Documentation/admin-guide/sysctl/kernel.rst, "random"); it lives in kernel memory (drivers/char/random.c,
# sysctl_bootid), so every boot has a new one. Read under the sysfs root ($DVFS_SYSFS_ROOT) so a fake tree sets it.
BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
PARENT_DIR_MODE = 0o755  # a folder made on the way to a state folder (run/, var/lib/ under a test prefix)


def current_boot_id() -> str | None:
    """This boot's id (`BOOT_ID_FILE` under the sysfs root), None where it cannot be read."""
    try:
        text = (settings.sysfs_root() / BOOT_ID_FILE).read_text().strip()
    except OSError:
        return None
    return text or None


def journal_dir() -> Path:
    """Where restore journals live: /var/lib/dvfs-mlops (under $DVFS_SYSTEM_STATE_PREFIX)."""
    return settings.system_state_prefix() / SYSTEM_JOURNAL_DIR


def lock_dir() -> Path:
    """Where locks live: /run/dvfs-mlops/state (under $DVFS_SYSTEM_STATE_PREFIX)."""
    return settings.system_state_prefix() / SYSTEM_LOCK_DIR


# -- folders and files nobody else can redirect -------------------------------------------------------------------------
def _refuse(path: Path | str, why: str, what: str = "state folder") -> StateFolderError:
    err = StateFolderError(f"refusing the {what} {path}: {why}; nothing was read or written there")
    logger.error("%s", err)
    return err


def _ancestor_ok(st: os.stat_result) -> bool:
    """A folder on the way: root's or ours, and writable by nobody else unless it is root's sticky folder (/tmp), where
    nobody can rename or remove another user's entries (sticky bit, Linux `may_delete`)."""
    if st.st_uid not in (0, os.geteuid()):
        return False
    return not (st.st_mode & 0o022) or bool(st.st_mode & stat.S_ISVTX and st.st_uid == 0)


def _open_component(parent_fd: int, name: str, mode: int | None, where: Path, what: str) -> int:
    """Open folder `name` in `parent_fd` without following a link; create it with exactly `mode` where missing (None:
    never create)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if mode is None:
            raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(where, "it is a symbolic link or not a folder", what) from None
        raise
    with contextlib.suppress(FileExistsError):  # a folder made at the same moment by another writer is checked below
        os.mkdir(name, mode, dir_fd=parent_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask took away
        return fd
    return _open_component(parent_fd, name, None, where, what)


def _walk(path: Path, create: bool, private: bool, what: str = "state folder") -> int:
    """Open `path` from / one component at a time (module doc); see `open_private_dir` and `open_trusted_dir`."""
    path = Path(os.path.abspath(path))
    fd = os.open("/", DIR_FLAGS)
    try:
        parts = path.parts[1:]
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            where = Path("/", *parts[: i + 1])
            try:
                child = _open_component(fd, name, (PRIVATE_DIR_MODE if last else PARENT_DIR_MODE) if create else None, where,
                                        what)
            except PermissionError:
                raise DevicePermissionError(f"{where} is root's: the GPU clock's lock and journal live there, so only root "
                                            "writes clocks directly; pin through the clock service (sudo dvfs-mlops clockd "
                                            "install) or run as root") from None
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            if not (last and private) and not _ancestor_ok(st):
                raise _refuse(path, f"{where} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o} (it must "
                                    "be root's and writable by root alone)", what)
        st = os.fstat(fd)
        if private and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
            raise _refuse(path, f"it is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}, not uid "
                                f"{os.geteuid()}'s own 0700 folder: remove it (rm -r {path}) and retry")
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_private_dir(path: Path, create: bool = True) -> int:
    """A descriptor of the state folder `path`, reached from / one component at a time without following a link.

    Every folder on the way must be root's or this user's and not writable by others (a sticky folder of root's, as
    /tmp, passes); `path` itself must be this user's with no group or other bits. Missing folders are created where
    `create` (the state folder 0700, those above it 0755).

    Args:
        path: the folder.
        create: make what is missing; False raises FileNotFoundError instead.

    Returns:
        An O_DIRECTORY descriptor (close it).

    Raises:
        StateFolderError: a symbolic link, another owner or a loose mode on the way (logged).
        DevicePermissionError: this user may not enter a folder on the way (a root-only state folder, not root).
        FileNotFoundError: a folder is missing and `create` is False.
    """
    return _walk(path, create, private=True)


def open_trusted_dir(path: Path, what: str = "folder") -> int:
    """A descriptor of folder `path` (a config's, the socket's), reached as `open_private_dir` reaches one, where `path`
    itself, like every folder above it, must be root's (or this user's) and writable by nobody else; nothing is created.

    Raises:
        StateFolderError: a symbolic link, another owner or a loose mode on the way (logged).
        FileNotFoundError: a folder is missing. DevicePermissionError: this user may not enter a folder on the way.
    """
    return _walk(path, False, private=False, what=what)


@contextlib.contextmanager
def private_dir(path: Path, create: bool = True) -> Iterator[int]:
    """`open_private_dir` for a `with` block."""
    fd = open_private_dir(path, create)
    try:
        yield fd
    finally:
        os.close(fd)


def _check_file(fd: int, path: Path) -> None:
    """A file opened in a private folder: a regular file of ours, 0600."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise _refuse(path, f"{path.name} is not a regular file of uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:
        os.fchmod(fd, PRIVATE_FILE_MODE)


def _open_file(dir_fd: int, name: str, flags: int, path: Path) -> int:
    """Open `name` in a private folder without following a link (a link there is refused, logged)."""
    try:
        return os.open(name, flags | FILE_FLAGS, PRIVATE_FILE_MODE, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(path.parent, f"{name} is a symbolic link") from None
        raise


def _read_private(dir_fd: int, name: str, path: Path) -> str:
    fd = _open_file(dir_fd, name, os.O_RDONLY, path)
    try:
        _check_file(fd, path)
        with os.fdopen(os.dup(fd)) as f:
            return f.read()
    finally:
        os.close(fd)


def restore_failed(device_key: str, cause: BaseException | str, journal: Path) -> RestoreFailedError:
    """The one-line error of a restore that failed: what failed, the kept journal, what to run."""
    text = " ".join(str(cause).split()) or type(cause).__name__
    return RestoreFailedError(f"could not restore the clocks of {device_key}: {text}; the journal {journal} is kept: "
                              "fix that, then run `dvfs-mlops restore` (as the same user, e.g. with sudo)")


def _safe_key(device_key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in device_key)


@dataclasses.dataclass
class Journal:
    """What a session found before touching the clocks, enough to put it back."""

    backend: str
    device_key: str
    pid: int
    created: float
    settings: dict[str, Any]
    requested: str  # the frequency the session pinned, for the message
    boot_id: str | None = None  # the boot it was written in (None: unknown, as in journals written before it was kept)
    uid: int | None = None  # the user whose run pinned it (the clock service's client; None: the writing process's own)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Journal:
        """The journal in `text` (keys this version does not know are ignored).

        Raises:
            ValueError, TypeError: not a journal.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("not a journal")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def from_earlier_boot(self, boot_id: str | None) -> bool:
        """Whether the journal was written in another boot than `boot_id` (False where either is unknown)."""
        return bool(self.boot_id and boot_id and self.boot_id != boot_id)


def _journal_name(device_key: str) -> str:
    return f"restore-{_safe_key(device_key)}.json"


def journal_path(device_key: str, directory: Path | None = None) -> Path:
    """Where the journal of `device_key` lives (for messages; it is opened through its folder's descriptor)."""
    return (directory or journal_dir()) / _journal_name(device_key)


def read_journal(device_key: str, directory: Path | None = None) -> Journal | None:
    """The journal of `device_key`, None where there is none or it cannot be parsed.

    Raises:
        StateFolderError, DevicePermissionError: the folder is not this user's own (`open_private_dir`).
    """
    d = directory or journal_dir()
    try:
        with private_dir(d, create=False) as dfd:
            text = _read_private(dfd, _journal_name(device_key), d / _journal_name(device_key))
    except FileNotFoundError:
        return None
    try:
        return Journal.from_text(text)
    except (ValueError, TypeError):
        return None


def list_journals(directory: Path | None = None) -> list[tuple[Path, Journal]]:
    """Every readable journal in the journal folder, by name.

    Raises:
        StateFolderError, DevicePermissionError: the folder is not this user's own (`open_private_dir`).
    """
    d = directory or journal_dir()
    found = []
    try:
        with private_dir(d, create=False) as dfd:
            for name in sorted(os.listdir(dfd)):
                if not (name.startswith("restore-") and name.endswith(".json")):
                    continue
                try:
                    found.append((d / name, Journal.from_text(_read_private(dfd, name, d / name))))
                except (OSError, ValueError, TypeError, StateFolderError):
                    continue
    except FileNotFoundError:
        return []
    return found


def write_journal(journal: Journal, directory: Path | None = None) -> Path:
    """Write `journal` (a fresh 0600 file, fsync'd, then renamed over the old one; the folder is not fsync'd: a journal
    matters only until the next boot, which discards it).

    Returns:
        The journal's path.
    """
    d = directory or journal_dir()
    name = _journal_name(journal.device_key)
    with private_dir(d) as dfd:
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, PRIVATE_FILE_MODE, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(journal.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    return d / name


def clear_journal(device_key: str, directory: Path | None = None) -> None:
    """Remove the journal of `device_key` (nothing where there is none)."""
    with contextlib.suppress(FileNotFoundError), private_dir(directory or journal_dir(), create=False) as dfd:
        os.unlink(_journal_name(device_key), dir_fd=dfd)


class DeviceLock:
    """An exclusive, crash-safe claim on one device's clocks: `flock` on a 0600 file of the private lock folder."""

    def __init__(self, device_key: str, directory: Path | None = None):
        self.device_key = device_key
        self.directory = directory or lock_dir()
        self.path = self.directory / f"lock-{_safe_key(device_key)}.pid"
        self._fd: int | None = None
        self.took_over_pid: int | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            DeviceBusyError: another process holds it (the line names its PID).
            StateFolderError, DevicePermissionError: the lock folder is not this user's own (`open_private_dir`).
        """
        with private_dir(self.directory) as dfd:
            fd = _open_file(dfd, self.path.name, os.O_RDWR | os.O_CREAT, self.path)
        try:
            _check_file(fd, self.path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_pid(fd)
            os.close(fd)
            who = f"PID {owner}" if owner else "another process"
            raise DeviceBusyError(
                f"the clocks of {self.device_key} are in use by {who} (lock {self.path}); "
                "wait for it to finish or stop it, then retry"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        previous = _read_pid(fd)
        if previous and previous != os.getpid():
            self.took_over_pid = previous  # its owner died without releasing: flock proves it
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0).decode().strip()
        return int(raw) if raw else None
    except (OSError, ValueError):
        return None


class TerminationGuard:
    """SIGINT -> KeyboardInterrupt, SIGTERM/SIGHUP -> SystemExit(128+n), deferrable.

    While `deferring()`, a signal is remembered instead of raised, so the journal write + clock
    write, and the restore, are never cut in half; it is raised as soon as the block ends.
    Only the main thread can own signal handlers; elsewhere the guard does nothing.
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._deferring = 0
        self._pending: int | None = None

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        if self._deferring:
            self._pending = self._pending or signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for sig in (signal.SIGINT, *_CAUGHT_SIGNALS):
            self._previous[sig] = signal.signal(sig, self._handler)

    def uninstall(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous = {}

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self._pending is not None:
            signum, self._pending = self._pending, None
            self._raise(signum)


def now() -> float:
    return time.time()


class ClockOwnership:
    """Lock + journal for one session of a real backend.

    `claim()` takes the lock; a journal already there belongs to a run that died (we hold the
    flock, so its owner is gone) and is applied through `restore_settings` first: otherwise we'd
    record its pinned clock as "the original". A journal written in an earlier boot is removed
    instead (the reboot reset the clocks). Then our own journal is written, with this boot's id.

    Args:
        backend: "jetson" or "nvml".
        device_key: the clock domain (`lock-<key>.pid`, `restore-<key>.json`).
        restore_settings: applies a journal's settings.
        directory: one folder for both the lock and the journal (None: `lock_dir()` and `journal_dir()`).
        announce: called with the line saying a dead run's journal was applied (None: a WARNING log line).
    """

    def __init__(self, backend: str, device_key: str, restore_settings: Callable[[dict[str, Any]], None],
                 directory: Path | None = None, announce: Callable[[str], None] | None = None):
        self.backend = backend
        self._announce = announce or _stderr
        self.device_key = device_key
        self._restore_settings = restore_settings
        self._dir = directory
        self.lock = DeviceLock(device_key, directory)
        self.recovered: Journal | None = None

    @property
    def journal_path(self) -> Path:
        return journal_path(self.device_key, self._dir)

    def claim(self) -> None:
        """Take the lock; apply a dead run's journal first (one from an earlier boot is removed unapplied, with one
        log line). A failed leftover restore keeps that journal, releases the lock and raises RestoreFailedError."""
        self.lock.acquire()
        try:
            leftover = read_journal(self.device_key, self._dir)
        except BaseException:
            self.lock.release()
            raise
        path = self.journal_path
        boot_id = current_boot_id()
        if leftover is not None and leftover.from_earlier_boot(boot_id):
            logger.warning("dvfs-mlops: removed the journal %s of %s (pinned at %s by PID %s) from an earlier boot "
                           "(boot id %s, now %s) unapplied: the reboot already reset its clocks",
                           path, self.device_key, leftover.requested, leftover.pid, leftover.boot_id, boot_id)
            leftover = None
        if leftover is not None:
            try:
                self._restore_settings(leftover.settings)
            except Exception as e:  # noqa: BLE001 - whatever failed, keep the journal and free the lock
                self.lock.release()
                raise restore_failed(self.device_key, e, path) from None
            self.recovered = leftover
            self._announce(
                f"dvfs-mlops: restored the clocks of {self.device_key} left pinned at {leftover.requested} "
                f"by PID {leftover.pid} (killed?)"
            )
        clear_journal(self.device_key, self._dir)

    def record(self, settings: dict[str, Any], requested: str, pid: int | None = None, uid: int | None = None) -> None:
        """Write the journal before the first clock write.

        Args:
            settings: what to put back.
            requested: the clock pinned, for messages.
            pid: the run the pin is for (None: this process; the clock service names its client).
            uid: that run's user (None: this process's).
        """
        write_journal(Journal(self.backend, self.device_key, pid or os.getpid(), now(), settings, requested, current_boot_id(),
                              os.geteuid() if uid is None else uid), self._dir)

    def release(self) -> None:
        """The restore succeeded: remove the journal, then unlock."""
        clear_journal(self.device_key, self._dir)
        self.lock.release()

    def abandon(self) -> None:
        """The restore failed: keep the journal for `dvfs-mlops restore`, unlock."""
        self.lock.release()


def _stderr(message: str) -> None:
    """The default announcer: a WARNING on this module's logger (stderr when nobody configured logging)."""
    logger.warning(message)
