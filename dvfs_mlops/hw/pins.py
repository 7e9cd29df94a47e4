"""One clock domain's own pin: claim (lock) -> journal -> write; restore what the journal says. The one copy of that
order for every domain a backend pins itself (the Jetson's GPU, CPU and EMC clocks, an NVML GPU's memory clock).

A backend composes one `DomainPin` per domain it pins: every domain's lock is claimed before any journal or write
(so a busy domain refuses the pin with nothing touched), each domain's journal is written before its first write, and
the restore goes domain by domain in reverse, each keeping its journal where its own restore failed (`restore_all`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from dvfs_mlops.errors import DvfsError, RestoreFailedError
from dvfs_mlops.hw.guard import ClockOwnership, restore_failed


class DomainPin:
    """Lock, journal and write one clock domain; restore it (a no-op when nothing is held).

    Args:
        backend: the journal's backend ("jetson", "cpufreq", "emc", "nvml-memory").
        key: the domain's lock and journal key.
        settings: reads what a restore puts back (called once, when the journal is written).
        restore: puts a journal's settings back (also applied to a dead run's journal when the lock is claimed).
        owner: (pid, uid) the journal names (None, None: this process).
    """

    def __init__(self, backend: str, key: str, settings: Callable[[], dict[str, Any]],
                 restore: Callable[[dict[str, Any]], None], owner: tuple[int | None, int | None] = (None, None)):
        self.key = key
        self._settings = settings
        self._restore = restore
        self._owner = owner
        self._ownership = ClockOwnership(backend, key, restore)
        self._original: dict[str, Any] | None = None
        self.wrote = False  # a write went through: the restore writes back

    @property
    def held(self) -> bool:
        return self._ownership.lock.held

    @property
    def journal_path(self) -> Any:
        return self._ownership.journal_path

    def claim(self) -> None:
        """Take the domain's lock (a dead run's journal of it is applied first).

        Raises:
            DeviceBusyError: another process holds it. RestoreFailedError: a dead run's journal could not be applied.
        """
        self._ownership.claim()

    def record(self, requested: str) -> None:
        """Write the journal (what `settings` reads now), before the first write."""
        self._original = self._settings()
        self._ownership.record(self._original, requested, *self._owner)

    @property
    def recorded(self) -> bool:
        return self._original is not None

    def write(self, action: Callable[[], None]) -> None:
        """Run one write of the domain; from the first that went through on (a failed one's `partial`), the restore
        writes back.

        Raises:
            DvfsError: the write failed.
        """
        try:
            action()
        except DvfsError as e:
            self.wrote = self.wrote or getattr(e, "partial", True)
            raise
        self.wrote = True

    def restore(self) -> None:
        """Put back the journal's settings where a write went through, remove the journal, unlock.

        Raises:
            RestoreFailedError: the restore failed; the journal is kept and the lock released.
        """
        if not self.held:
            return
        original, self._original = self._original, None
        try:
            if original is not None and self.wrote:
                self._restore(original)
        except Exception as e:  # noqa: BLE001 - whatever failed, the journal must survive it
            self.wrote = False
            self._ownership.abandon()  # the journal stays: `dvfs-mlops restore` can finish the job
            raise restore_failed(self.key, e, self._ownership.journal_path) from None
        self.wrote = False
        self._ownership.release()


def claim_all(domains: Sequence[DomainPin]) -> None:
    """Claim every domain's lock in order; where one refuses, release those claimed before it (nothing was written).

    Raises:
        DeviceBusyError, RestoreFailedError, DvfsError: the first domain that could not be claimed.
    """
    claimed: list[DomainPin] = []
    try:
        for domain in domains:
            domain.claim()
            claimed.append(domain)
    except BaseException:
        for domain in reversed(claimed):
            with contextlib.suppress(DvfsError):
                domain.restore()
        raise


def restore_all(domains: Sequence[DomainPin]) -> None:
    """Restore every domain in reverse order, each on its own: one that fails keeps its journal and the others are
    still restored.

    Raises:
        RestoreFailedError: the first that failed (one line; where several did, how many).
    """
    failed: list[RestoreFailedError] = []
    for domain in reversed(domains):
        try:
            domain.restore()
        except RestoreFailedError as e:
            failed.append(e)
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise RestoreFailedError(f"{len(failed)} clock domains could not be restored; first: {failed[0]}")
