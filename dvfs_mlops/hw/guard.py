"""Safety around clock writes: a single-owner lock, a restore journal, and signal handling.

- Where: as root (needed to pin clocks) locks live in /run/lock/dvfs-mlops and journals in
  /var/lib/dvfs-mlops whatever HOME says, so `sudo`, `sudo -E` and a root shell agree on one
  owner per GPU; other users keep both in ~/.cache/dvfs-mlops. $DVFS_STATE_DIR puts both in one
  folder, except under sudo (SUDO_UID set), where `sudo -E` would keep it and plain `sudo` drop it. ($DVFS_SYSTEM_STATE_PREFIX prefixes the two system paths: for tests and chroots.)
- Lock: `lock-<device>.pid` under the lock dir, held with `flock`, so the kernel drops it when
  the owner dies (even by SIGKILL): a stale lock is taken over without guessing. The file holds
  the owner's PID for the "busy" message.
- Journal: `restore-<device>.json`, written and fsync'd before the first clock write, removed
  only after a successful restore: a failed restore keeps it (and releases the lock), so
  `dvfs-mlops restore` can finish the job once the cause is fixed. A journal whose owner is dead means a killed run left clocks pinned:
  `dvfs-mlops restore` (or the next session, automatically) puts them back.
- Boot id: a journal records the kernel's boot id. One written in an earlier boot is not applied (the reboot already
  reset the clocks, and applying it would override the power mode set since): it is removed with one log line.
- Signals: inside a session SIGTERM and SIGHUP raise `SystemExit`, so `with` blocks unwind and
  restore exactly as they do for exceptions and Ctrl-C.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DeviceBusyError, RestoreFailedError

_CAUGHT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

logger = logging.getLogger(__name__)


SYSTEM_LOCK_DIR = "run/lock/dvfs-mlops"
SYSTEM_JOURNAL_DIR = "var/lib/dvfs-mlops"
# The kernel's boot id: "a UUID generated the first time this is retrieved, and unvarying after that"
# (Documentation/admin-guide/sysctl/kernel.rst, "random"); it lives in kernel memory (drivers/char/random.c,
# sysctl_bootid), so every boot has a new one. Read under the sysfs root ($DVFS_SYSFS_ROOT) so a fake tree sets it.
BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"


def current_boot_id() -> str | None:
    """This boot's id (`BOOT_ID_FILE` under the sysfs root), None where it cannot be read."""
    try:
        text = (settings.sysfs_root() / BOOT_ID_FILE).read_text().strip()
    except OSError:
        return None
    return text or None


def _system_dir(rel: str) -> Path | None:
    """The system location for root, None for other users."""
    if os.geteuid() != 0:
        return None
    return settings.system_state_prefix() / rel


def _user_dir() -> Path:
    return settings.state_dir_override() or Path.home() / ".cache" / "dvfs-mlops"


def _override_applies() -> bool:
    """$DVFS_STATE_DIR counts, except for root under sudo: `sudo -E` keeps the variable and plain `sudo` drops it, so
    both take the system folders, and one lock per GPU holds whichever the user typed."""
    return settings.state_dir_override() is not None and not (os.geteuid() == 0 and settings.sudo_ids() is not None)


def journal_dir() -> Path:
    """Where restore journals live: $DVFS_STATE_DIR (not under sudo), else /var/lib/dvfs-mlops as root, else
    ~/.cache/dvfs-mlops."""
    if _override_applies():
        return _user_dir()
    return _system_dir(SYSTEM_JOURNAL_DIR) or _user_dir()


def lock_dir() -> Path:
    """Where locks live: $DVFS_STATE_DIR (not under sudo), else /run/lock/dvfs-mlops as root, else ~/.cache/dvfs-mlops."""
    if _override_applies():
        return _user_dir()
    return _system_dir(SYSTEM_LOCK_DIR) or _user_dir()


def state_dir() -> Path:
    """The journal dir, the same as `journal_dir()`."""
    return journal_dir()


def restore_failed(device_key: str, cause: BaseException | str, journal: Path) -> RestoreFailedError:
    """The one-line error of a restore that failed: what failed, the kept journal, what to run."""
    text = " ".join(str(cause).split()) or type(cause).__name__
    return RestoreFailedError(f"could not restore the GPU clocks of {device_key}: {text}; the journal {journal} is kept: "
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
    def from_file(cls, path: Path) -> Journal:
        """The journal at `path` (keys this version does not know are ignored)."""
        data = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def from_earlier_boot(self, boot_id: str | None) -> bool:
        """Whether the journal was written in another boot than `boot_id` (False where either is unknown)."""
        return bool(self.boot_id and boot_id and self.boot_id != boot_id)


def journal_path(device_key: str, directory: Path | None = None) -> Path:
    return (directory or journal_dir()) / f"restore-{_safe_key(device_key)}.json"


def list_journals(directory: Path | None = None) -> list[tuple[Path, Journal]]:
    d = directory or journal_dir()
    found = []
    for path in sorted(d.glob("restore-*.json")) if d.exists() else []:
        try:
            found.append((path, Journal.from_file(path)))
        except (OSError, ValueError, TypeError):
            continue
    return found


def write_journal(journal: Journal, directory: Path | None = None) -> Path:
    path = journal_path(journal.device_key, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(journal.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def clear_journal(device_key: str, directory: Path | None = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        journal_path(device_key, directory).unlink()


class DeviceLock:
    """An exclusive, crash-safe claim on one device's clocks."""

    def __init__(self, device_key: str, directory: Path | None = None):
        self.device_key = device_key
        self.path = (directory or lock_dir()) / f"lock-{_safe_key(device_key)}.pid"
        self._fd: int | None = None
        self.took_over_pid: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_pid(fd)
            os.close(fd)
            who = f"PID {owner}" if owner else "another process"
            raise DeviceBusyError(
                f"the GPU clocks of {self.device_key} are in use by {who} (lock {self.path}); "
                "wait for it to finish or stop it, then retry"
            ) from None
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

    def _handler(self, signum: int, _frame: Any) -> None:
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
    """

    def __init__(self, backend: str, device_key: str, restore_settings: Any, directory: Path | None = None, announce: Any = None):
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
        path = self.journal_path
        if path.exists():
            try:
                leftover = Journal.from_file(path)
            except (OSError, ValueError, TypeError):
                leftover = None
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
