"""CPU clocks through cpufreq: every policy of the board read, pinned and restored as the GPU's devfreq range is.

What the files are (Linux Documentation/admin-guide/pm/cpufreq.rst, "Policy Interface in sysfs"): one folder per
policy, /sys/devices/system/cpu/cpufreq/policyX, each CPU's cpufreq folder a link to its policy's; related_cpus (the
CPUs the policy covers) and affected_cpus (those online); cpuinfo_min_freq/cpuinfo_max_freq (the hardware's limits);
scaling_available_frequencies (the table); scaling_cur_freq (the clock the policy's CPUs run at as the kernel knows
it: "In the majority of cases, this is the frequency of the last P-state requested by the scaling driver") and
cpuinfo_cur_freq ("as obtained from the hardware", root only); every frequency in kHz.

What a write does and a read says (torvalds/linux drivers/cpufreq/cpufreq.c): a write to scaling_min_freq or
scaling_max_freq is the user's frequency QoS request (store_one: freq_qos_update_request), and a read shows policy->min
or policy->max (show_one), which cpufreq_set_policy computes from every request on the policy (the user's,
nvpmodel's, a thermal cooling device's: drivers/thermal/cpufreq_cooling.c caps the same FREQ_QOS_MAX), kept within
cpuinfo and with min never above max, resolved to the table. The linux-pm discussion of "cpufreq: Add
user_min/max_freq" (L. Crestez, 2019) says the same from the other side: these files show the "effective" limits, not
the user's. So, as for the GPU, a read is never the user's setting: the restore writes back the user-level range, the
power mode's CPU MIN_FREQ/MAX_FREQ for the policy (nvpmodel writes them into these same files: NVIDIA's Orin template
names CPU_A78_<k> MIN_FREQ/MAX_FREQ with the scaling_min_freq/scaling_max_freq of cluster k's first CPU,
mlcommons/inference_results_v3.0 closed/Neuchips/code/common/nvpmodel_orin.py), or cpuinfo_min_freq/cpuinfo_max_freq
where no mode names the policy.

Write order: Linux 4.9 (JetPack 4) refused a min above the current max (cpufreq_set_policy's "new_policy->min >
policy->max" check); since the freq QoS rework (5.4, JetPack 5/6) nothing is refused and a min above the max reads as
the max. The pin writes so that min <= max holds at every step either way (raising: max first), and takes the other
order where the first write is refused with EINVAL (the read it chose from aggregates other limits).

A policy whose CPUs are all offline (nvpmodel takes cores offline in low modes) is inactive: cpufreq.c answers EBUSY
to every read and write of its attributes. Such a policy is left out (its table cannot be read).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DevicePermissionError, DvfsError, unknown
from dvfs_mlops.hw.board import PowerMode
from dvfs_mlops.hw.sysfs import read_sysfs as _read
from dvfs_mlops.hw.sysfs import write_sysfs

log = logging.getLogger(__name__)

CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"
DOMAIN_KEY = "jetson-cpufreq"  # the CPU clock domain's lock and journal (`guard.ClockOwnership`): one for every policy
JOURNAL_BACKEND = "cpufreq"


@dataclasses.dataclass(frozen=True)
class CpuPolicy:
    """One cpufreq policy as discovery read it.

    Attributes:
        name: policyX.
        path: its folder (under the sysfs root).
        cpus: related_cpus.
        table_khz: scaling_available_frequencies, ascending.
        cpuinfo_khz: (cpuinfo_min_freq, cpuinfo_max_freq).
    """

    name: str
    path: Path
    cpus: tuple[int, ...]
    table_khz: tuple[int, ...]
    cpuinfo_khz: tuple[int, int]

    @property
    def table_mhz(self) -> tuple[float, ...]:
        return tuple(k / 1000.0 for k in self.table_khz)

    def nearest_khz(self, mhz: float) -> int:
        """The policy's clock for a request: the request itself where the table has it, else the highest of the table
        below it (the lowest where none is)."""
        khz = round(mhz * 1000)
        if khz in self.table_khz:
            return khz
        below = [k for k in self.table_khz if k <= khz]
        return below[-1] if below else self.table_khz[0]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split() if x.isdigit()]


def find_policies(root: Path) -> list[CpuPolicy]:
    """Every active cpufreq policy under `root` (by policy number); [] where the kernel has no cpufreq."""
    base = root / CPUFREQ_DIR
    found = []
    for folder in sorted(base.glob("policy*"), key=lambda p: int(p.name.removeprefix("policy") or 0)):
        try:
            table = tuple(sorted(_ints(_read(folder / "scaling_available_frequencies"))))
            cpus = tuple(_ints(_read(folder / "related_cpus")))
            info = (int(_read(folder / "cpuinfo_min_freq")), int(_read(folder / "cpuinfo_max_freq")))
        except (OSError, ValueError) as e:  # EBUSY: every CPU of it is offline (module doc)
            log.info("cpufreq %s left out: %s", folder.name, e)
            continue
        if table:
            found.append(CpuPolicy(folder.name, folder, cpus, table, info))
    return found


class CpuClocks:
    """The CPU clock domain of a board: every active cpufreq policy.

    Args:
        root: the sysfs root.
        writer: performs each write (default: one write(2)); tests pass a fake kernel's.
    """

    def __init__(self, root: Path, writer: Callable[[Path, str], None] | None = None):
        self.root = root
        self._writer = writer or write_sysfs
        self.policies = find_policies(root)

    @property
    def frequencies_mhz(self) -> list[float]:
        """Every clock some policy's table has, ascending (the CPU knob's table)."""
        return sorted({k / 1000.0 for p in self.policies for k in p.table_khz})

    def targets_khz(self, mhz: float) -> dict[str, int]:
        """Each policy's clock for a CPU clock of `frequencies_mhz` (`CpuPolicy.nearest_khz`).

        Raises:
            UnknownNameError: no policy's table has `mhz`; the message lists the clocks.
        """
        if not any(round(mhz * 1000) in p.table_khz for p in self.policies):
            raise unknown("CPU clock", f"{mhz:g}", [f"{f:g}" for f in self.frequencies_mhz])
        return {p.name: p.nearest_khz(mhz) for p in self.policies}

    def policy(self, name: str) -> CpuPolicy:
        for p in self.policies:
            if p.name == name:
                return p
        raise DvfsError(f"no cpufreq {name} under {self.root / CPUFREQ_DIR} now")

    def read_range_khz(self, name: str) -> tuple[int, int]:
        """scaling_min_freq and scaling_max_freq as they read: every limit together (module doc), not the user's."""
        path = self.policy(name).path
        return int(_read(path / "scaling_min_freq")), int(_read(path / "scaling_max_freq"))

    def user_range_khz(self, name: str, mode: PowerMode | None) -> tuple[int, int]:
        """The user-level range of a policy: the power mode's CPU MIN_FREQ/MAX_FREQ for it within cpuinfo (a missing or
        0 / -1 value: that end of cpuinfo), else cpuinfo_min_freq..cpuinfo_max_freq."""
        pol = self.policy(name)
        lo, hi = pol.cpuinfo_khz
        mode_lo, mode_hi = mode.cpu_range_khz(pol.cpus) if mode is not None else (None, None)
        if mode_lo is not None:
            lo = min(max(mode_lo, pol.cpuinfo_khz[0]), pol.cpuinfo_khz[1])
        if mode_hi is not None:
            hi = min(max(mode_hi, pol.cpuinfo_khz[0]), pol.cpuinfo_khz[1])
        return min(lo, hi), hi

    def mode_cap_mhz(self, mode: PowerMode | None) -> float | None:
        """The lowest CPU MAX_FREQ the power mode sets on any policy, in MHz (None: no mode, or it caps none)."""
        caps = [mode.cpu_range_khz(p.cpus)[1] for p in self.policies] if mode is not None else []
        known = [c for c in caps if c is not None]
        return min(known) / 1000.0 if known else None

    def above_mode_cap(self, targets: dict[str, int], mode: PowerMode | None) -> dict[str, float]:
        """The policies whose target is above the mode's CPU MAX_FREQ for them: name -> that cap in MHz."""
        out = {}
        for p in self.policies:
            cap = mode.cpu_range_khz(p.cpus)[1] if mode is not None else None
            if cap is not None and targets.get(p.name, 0) > cap:
                out[p.name] = cap / 1000.0
        return out

    def settings(self, mode: PowerMode | None) -> dict[str, Any]:
        """What a journal records: per policy the user-level range restore writes (`user_range_khz`), the range as read
        (every limit together, for the record only) and the governor."""
        policies = {}
        for p in self.policies:
            lo, hi = self.user_range_khz(p.name, mode)
            read_lo, read_hi = self.read_range_khz(p.name)
            entry: dict[str, Any] = {"min_khz": lo, "max_khz": hi, "read_min_khz": read_lo, "read_max_khz": read_hi}
            with contextlib.suppress(OSError):
                entry["governor"] = _read(p.path / "scaling_governor")
            policies[p.name] = entry
        return {"root": str(self.root), "policies": policies}

    # writing ---------------------------------------------------------------------------------------------------------
    def writable(self) -> bool:
        """Whether this process may write every policy's range itself."""
        return bool(self.policies) and all(os.access(p.path / n, os.W_OK) for p in self.policies
                                           for n in ("scaling_min_freq", "scaling_max_freq"))

    def _write(self, pol: CpuPolicy, name: str, value: str) -> None:
        path = pol.path / name
        real = Path(os.path.realpath(path))
        if path.is_symlink() or real.parent != Path(os.path.realpath(pol.path)):
            raise DvfsError(f"refusing to write {path}: it resolves to {real}, outside the cpufreq policy {pol.path}")
        try:
            self._writer(path, value)
        except PermissionError:
            raise DevicePermissionError(f"no permission to write {path}; install the clock service once (sudo dvfs-mlops "
                                        "clockd install) or run as root to change the CPU clock") from None
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                raise DevicePermissionError(f"no permission to write {path}; run as root") from None
            err = DvfsError(f"the kernel refused {value} for {path}: {e.strerror or e}")
            err.errno = e.errno  # type: ignore[attr-defined]
            raise err from None

    def write_range(self, name: str, min_khz: int, max_khz: int) -> None:
        """Set the user's [min, max] request of one policy with min <= max at every step (module doc).

        Raises:
            DevicePermissionError, DvfsError: a write failed; its `partial` says whether one write went through before.
        """
        pol = self.policy(name)
        _lo, read_hi = self.read_range_khz(name)
        order = [("scaling_max_freq", max_khz), ("scaling_min_freq", min_khz)] if min_khz > read_hi else \
            [("scaling_min_freq", min_khz), ("scaling_max_freq", max_khz)]
        try:
            try:
                self._write(pol, order[0][0], str(order[0][1]))
            except DvfsError as e:
                if getattr(e, "errno", None) != errno.EINVAL:
                    raise
                order.reverse()
                self._write(pol, order[0][0], str(order[0][1]))
        except DvfsError as e:
            e.partial = False  # type: ignore[attr-defined]
            raise
        try:
            self._write(pol, order[1][0], str(order[1][1]))
        except DvfsError as e:
            e.partial = True  # type: ignore[attr-defined]
            raise

    def pin(self, targets: dict[str, int]) -> None:
        """Pin each policy at its target ([t, t]), in policy order.

        Raises:
            DvfsError: a write failed; `partial` says whether any write went through before.
        """
        wrote = False
        for name, khz in targets.items():
            try:
                self.write_range(name, khz, khz)
            except DvfsError as e:
                e.partial = wrote or getattr(e, "partial", True)  # type: ignore[attr-defined]
                raise
            wrote = True

    def restore_settings(self, settings: dict[str, Any], mode: PowerMode | None) -> None:
        """Put back the user-level range of every policy the journal names (`user_range_khz` with the mode in force now,
        so an `nvpmodel -m` made during the session stands) and the governor it found.

        Raises:
            DvfsError: a write failed (the others are still tried; the first failure is raised).
        """
        first: DvfsError | None = None
        for name, entry in dict(settings.get("policies", {})).items():
            if not any(p.name == name for p in self.policies):
                log.warning("cpufreq %s named in the journal is not active now: nothing to restore on it", name)
                continue
            try:
                self.write_range(name, *self.user_range_khz(name, mode))
                gov = entry.get("governor") if isinstance(entry, dict) else None
                pol = self.policy(name)
                with contextlib.suppress(OSError, DvfsError):
                    if gov and _read(pol.path / "scaling_governor") != gov:
                        self._write(pol, "scaling_governor", str(gov))
            except DvfsError as e:
                first = first or e
        if first is not None:
            raise first

    # reading back ----------------------------------------------------------------------------------------------------
    def reader(self, measured: bool) -> tuple[Callable[[], Sequence[float | None]], Callable[[], None], str]:
        """A reader of each policy's clock (MHz, in `policies` order), its closer, and what it reads: cpuinfo_cur_freq
        (the hardware's, root only) where `measured` and readable, else scaling_cur_freq ("measured", "requested")."""
        name = "cpuinfo_cur_freq" if measured and self.policies and os.access(self.policies[0].path / "cpuinfo_cur_freq",
                                                                             os.R_OK) else "scaling_cur_freq"
        fds: list[int | None] = []
        for p in self.policies:
            try:
                fds.append(os.open(p.path / name, os.O_RDONLY))
            except OSError:
                fds.append(None)

        def read() -> list[float | None]:
            out: list[float | None] = []
            for fd in fds:
                try:
                    out.append(int(os.pread(fd, 32, 0).strip()) / 1000.0 if fd is not None else None)
                except (OSError, ValueError):
                    out.append(None)
            return out

        def close() -> None:
            for fd in fds:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)

        return read, close, "measured" if name == "cpuinfo_cur_freq" else "requested"
