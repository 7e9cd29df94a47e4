"""`dvfs-mlops run`: any program under a pinned clock, metered, always restored."""
from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.meter import EnergyReport


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What `dvfs-mlops run` measured: the clock asked for, the device, the command's exit code and the EnergyReport."""

    freq: str
    observe: bool
    device: str
    device_profile: str
    device_id: str | None
    returncode: int
    report: EnergyReport

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: the request, the device, the exit code and every field of the report."""
        return {"freq": self.freq, "observe": self.observe, "device": self.device, "device_profile": self.device_profile,
                "device_id": self.device_id, "returncode": self.returncode, **self.report.to_dict()}

    def line(self) -> str:
        """The one-line summary the command prints on stderr."""
        report = self.report
        label = " (SIMULATED)" if report.simulated else ""
        clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
        held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
        failed = f", {report.samples_failed} failed" if report.samples_failed else ""
        return (f"energy{label}: {report.energy_j:.2f} J CPU+GPU, {report.energy_total_j:.2f} J all rails, "
                f"{report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, peak {report.peak_power_w:.2f} W, "
                f"{report.samples} samples{failed}{clock}{held}{' [observe]' if self.observe else ''}; exit code {self.returncode}")


def run_command(freq: str, observe: bool, choice: DeviceChoice, command: Sequence[str],
                say: Callable[[str], None] = lambda _m: None) -> RunOutcome:
    """`dvfs-mlops run`: check everything (the clock, the command, the device), then run the command metered.

    Args:
        freq: a clock of the device's table in MHz, or 'maxn'; '' with `observe` (meter under the clocks as found).
        observe: meter only: write no clock, take no lock.
        choice: the device to run on.
        command: the program and its arguments (never a shell string).
        say: where the 'device: ...' line goes, once every check has passed.

    Returns:
        The `RunOutcome` (the command's exit code in it).

    Raises:
        DvfsError: no --freq and no --observe, a clock not in the table, a command that does not exist, a device
            that cannot be opened (all before anything runs), or a refused clock write.
    """
    if not freq and not observe:
        raise DvfsError("give --freq MHZ (or maxn), or --observe to meter without touching the clock")
    from dvfs_mlops.hw import parse_freq

    dev = open_chosen(choice, load_twin(choice))
    freq = freq or "maxn"
    parse_freq(freq, dev.frequencies_mhz)  # bad input is an error before anything is announced or run
    check_command(list(command))
    say(announcement(dev, choice))
    rc, report = run_metered(dev, freq, list(command), observe=observe)
    return RunOutcome(freq, observe, dev.name, dev.profile, getattr(dev, "device_id", None), rc, report)


def run_metered(device: Any, freq: str, command: list[str], observe: bool = False) -> tuple[int, EnergyReport]:
    """Run `command` (an argv list, never a shell string) inside a FreqSession (`observe`: meter only).

    SIGINT/SIGTERM reaching us are forwarded to the child; the session restores the clock on the
    way out whatever happens.
    """
    check_command(command)
    session = device.session(freq, observe=observe)
    with session:
        proc = subprocess.Popen(command)
        try:
            rc = proc.wait()
        except BaseException:
            _stop_child(proc)
            raise
    return (rc if rc >= 0 else 128 - rc), session.report()


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
