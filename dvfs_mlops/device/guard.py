"""Safety around clock writes: a single-owner lock, a restore journal, and signal handling.

- Lock: `lock-<device>.pid` under the state dir, held with `flock`, so the kernel drops it when
  the owner dies (even by SIGKILL): a stale lock is taken over without guessing. The file holds
  the owner's PID for the "busy" message.
- Journal: `restore-<device>.json`, written and fsync'd before the first clock write, removed
  after the restore. A journal whose owner is dead means a killed run left clocks pinned:
  `dvfs-mlops restore` (or the next session, automatically) puts them back.
- Signals: inside a session SIGTERM and SIGHUP raise `SystemExit`, so `with` blocks unwind and
  restore exactly as they do for exceptions and Ctrl-C.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DeviceBusyError

_CAUGHT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def state_dir() -> Path:
    """Where journals and locks live: $DVFS_STATE_DIR, else ~/.cache/dvfs-mlops."""
    base = os.environ.get("DVFS_STATE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "dvfs-mlops"


def _safe_key(device_key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in device_key)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass
class Journal:
    """What a session found before touching the clocks, enough to put it back."""

    backend: str
    device_key: str
    pid: int
    created: float
    settings: dict[str, Any]
    requested: str  # the frequency the session pinned, for the message

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> Journal:
        return cls(**json.loads(path.read_text()))


def journal_path(device_key: str, directory: Path | None = None) -> Path:
    return (directory or state_dir()) / f"restore-{_safe_key(device_key)}.json"


def list_journals(directory: Path | None = None) -> list[tuple[Path, Journal]]:
    d = directory or state_dir()
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
        self.path = (directory or state_dir()) / f"lock-{_safe_key(device_key)}.pid"
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

    def take_pending(self) -> int | None:
        signum, self._pending = self._pending, None
        return signum


def now() -> float:
    return time.time()


class ClockOwnership:
    """Lock + journal for one session of a real backend.

    `claim()` takes the lock; a journal already there belongs to a run that died (we hold the
    flock, so its owner is gone) and is applied through `restore_settings` first: otherwise we'd
    record its pinned clock as "the original". Then our own journal is written.
    """

    def __init__(self, backend: str, device_key: str, restore_settings: Any, directory: Path | None = None, announce: Any = None):
        self.backend = backend
        self._announce = announce or _stderr
        self.device_key = device_key
        self._restore_settings = restore_settings
        self._dir = directory
        self.lock = DeviceLock(device_key, directory)
        self.recovered: Journal | None = None

    def claim(self) -> None:
        self.lock.acquire()
        path = journal_path(self.device_key, self._dir)
        if path.exists():
            try:
                leftover = Journal.from_file(path)
            except (OSError, ValueError, TypeError):
                leftover = None
            if leftover is not None:
                self._restore_settings(leftover.settings)
                self.recovered = leftover
                self._announce(
                    f"dvfs-mlops: restored the clocks of {self.device_key} left pinned at {leftover.requested} "
                    f"by PID {leftover.pid} (killed?)"
                )
            clear_journal(self.device_key, self._dir)

    def record(self, settings: dict[str, Any], requested: str) -> None:
        write_journal(Journal(self.backend, self.device_key, os.getpid(), now(), settings, requested), self._dir)

    def release(self) -> None:
        clear_journal(self.device_key, self._dir)
        self.lock.release()


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr)
