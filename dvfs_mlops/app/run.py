"""`dvfs-mlops run`: any program under a pinned clock, metered, always restored.

On nvml, every GPU the program can see is pinned, metered and restored (`hw/multi.py`: CUDA_VISIBLE_DEVICES, else
every GPU), so a `torchrun --nproc-per-node N` job runs at one clock on all its GPUs and its energy is their sum;
`--gpu-index` pins that one GPU alone.
"""
from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen, refuse_replay
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.hw.multi import GpuEnergy


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What `dvfs-mlops run` measured: the clock asked for, the device, the command's exit code and the EnergyReport
    (with several GPUs, their sum: `hw.multi.combine`, and each GPU's own in `gpus`)."""

    freq: str
    observe: bool
    device: str
    device_profile: str
    device_id: str | None
    returncode: int
    report: EnergyReport
    gpus: tuple[GpuEnergy, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: the request, the device, the exit code and every field of the report; with several
        GPUs the report is their sum, `gpus` lists each GPU's (index, uuid, report) and `gpu_count` how many."""
        several = {"gpu_count": len(self.gpus), "gpus": [g.to_dict() for g in self.gpus]} if len(self.gpus) > 1 else {}
        return {"freq": self.freq, "observe": self.observe, "device": self.device, "device_profile": self.device_profile,
                "device_id": self.device_id, "returncode": self.returncode, **self.report.to_dict(), **several}

    def lines(self) -> list[str]:
        """What the command prints on stderr: the one-line summary; with several GPUs, one line per GPU first and the
        summary as their sum."""
        if len(self.gpus) <= 1:
            return [self.line()]
        per_gpu = [f"GPU {g.index} ({g.uuid}): {_energy(g.report)}" for g in self.gpus]
        return [*per_gpu, f"sum of {len(self.gpus)} GPUs: {self.line()}"]

    def line(self) -> str:
        """The one-line summary (with several GPUs, of their sum)."""
        report = self.report
        label = " (SIMULATED)" if report.simulated else ""
        clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
        held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
        failed = f", {report.samples_failed} failed" if report.samples_failed else ""
        return (f"energy{label}: {report.energy_j:.2f} J CPU+GPU, {report.energy_total_j:.2f} J all rails, "
                f"{report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, peak {report.peak_power_w:.2f} W, "
                f"{report.samples} samples{failed}{clock}{held}{' [observe]' if self.observe else ''}; exit code {self.returncode}")


def _energy(report: EnergyReport) -> str:
    clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
    held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
    return f"{report.energy_j:.2f} J, {report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, {report.samples} samples{clock}{held}"


def run_command(freq: str, observe: bool, choice: DeviceChoice, command: Sequence[str],
                say: Callable[[str], None] = lambda _m: None, all_gpus: bool = True) -> RunOutcome:
    """`dvfs-mlops run`: check everything (the clock, the command, the device), then run the command metered.

    Args:
        freq: a clock of the device's table in MHz, or 'maxn'; '' with `observe` (meter under the clocks as found).
        observe: meter only: write no clock, take no lock.
        choice: the device to run on.
        command: the program and its arguments (never a shell string).
        say: where the 'device: ...' line goes, once every check has passed.
        all_gpus: nvml: pin and meter every GPU the command can see (CUDA_VISIBLE_DEVICES, else all); False: the
            chosen `gpu_index` alone.

    Returns:
        The `RunOutcome` (the command's exit code in it).

    Raises:
        DvfsError: a replay device (nothing to run), no --freq and no --observe, a clock not in the table, a command
            that does not exist, a device that cannot be opened, CUDA_VISIBLE_DEVICES naming some GPUs by index (all before anything runs), or a
            refused clock write (every GPU pinned before it is restored).
    """
    refuse_replay(choice, "run")
    if not freq and not observe:
        raise DvfsError("give --freq MHZ (or maxn), or --observe to meter without touching the clock")
    from dvfs_mlops.hw import parse_freq

    dev = open_chosen(choice, load_twin(choice))
    freq = freq or "maxn"
    if dev.name == "nvml" and all_gpus:
        from dvfs_mlops.hw.multi import open_visible

        devices = open_visible(dev)
        if len(devices) > 1:
            return _run_on_gpus(devices, freq, observe, choice, list(command), say)
        dev = devices[0]
        if choice.device_id.strip():
            dev.device_id = choice.device_id.strip()
    parse_freq(freq, dev.frequencies_mhz)  # bad input is an error before anything is announced or run
    check_command(list(command))
    say(announcement(dev, choice))
    rc, report = run_metered(dev, freq, list(command), observe=observe)
    return RunOutcome(freq, observe, dev.name, dev.profile, getattr(dev, "device_id", None), rc, report)


def _run_on_gpus(devices: list[Any], freq: str, observe: bool, choice: DeviceChoice, command: list[str],
                 say: Callable[[str], None]) -> RunOutcome:
    """`run` on several GPUs: every check first (the clock in each GPU's table, the command), then each pinned in NVML
    index order, the command run once, each restored; the outcome holds each GPU's report and their sum."""
    from dvfs_mlops.hw import parse_freq
    from dvfs_mlops.hw.multi import GpuSessions, combine

    try:
        for dev in devices:
            try:
                parse_freq(freq, dev.frequencies_mhz)
            except DvfsError as e:
                raise DvfsError(f"GPU {dev.index} ({dev.gpu_name}): {e}") from None
        check_command(command)
        for dev in devices:
            say(announcement(dev, choice))
        sessions = GpuSessions(devices, freq, observe=observe)
        rc = run_in(sessions, command)
        gpus = tuple(sessions.reports())
    finally:
        for dev in devices:
            dev.close()
    names = {dev.profile for dev in devices}
    return RunOutcome(freq, observe, "nvml", ",".join(sorted(names)),
                      choice.device_id.strip() or None, rc, combine([g.report for g in gpus]), gpus)


def run_metered(device: Any, freq: str, command: list[str], observe: bool = False) -> tuple[int, EnergyReport]:
    """Run `command` (an argv list, never a shell string) inside a FreqSession (`observe`: meter only).

    SIGINT/SIGTERM reaching us are forwarded to the child; the session restores the clock on the
    way out whatever happens.
    """
    check_command(command)
    session = device.session(freq, observe=observe)
    return run_in(session, command), session.report()


def run_in(session: Any, command: list[str]) -> int:
    """Run `command` inside `session` (one FreqSession, or `GpuSessions`); its exit code (128+N for a signal N).

    SIGINT/SIGTERM reaching us are forwarded to the child; the session restores on the way out whatever happens.
    """
    with session:
        proc = subprocess.Popen(command)
        try:
            rc = proc.wait()
        except BaseException:
            _stop_child(proc)
            raise
    return rc if rc >= 0 else 128 - rc


def check_command(command: list[str]) -> None:
    """A command is given and its program exists.

    Raises:
        DvfsError: no command, or its program is not found on PATH.
    """
    if not command:
        raise DvfsError("no command given; usage: dvfs-mlops run --freq MHZ -- CMD ARGS...")
    if shutil.which(command[0]) is None:
        raise DvfsError(f"command not found: {command[0]}")


def _stop_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
