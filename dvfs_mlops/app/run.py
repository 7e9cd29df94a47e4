"""`dvfs-mlops run`: any program under a pinned clock, metered, always restored.

Which GPUs on nvml. `--gpu-index N` pins and meters that GPU alone. CUDA_VISIBLE_DEVICES set: every GPU it names
(`hw/multi.py`), so a `torchrun --nproc-per-node N` job runs at one clock on all its GPUs and its energy is their sum.
CUDA_VISIBLE_DEVICES unset on a box of several GPUs: only the GPUs the program's processes use, each pinned and metered
from the moment NVML lists one of them on it (`hw.multi.JobGpuSessions`; a clock lock is device-global, so pinning
every GPU would change other users' jobs); where NVML cannot list processes the command is refused before it starts,
naming --gpu-index, CUDA_VISIBLE_DEVICES and --all-gpus (every GPU, from the start).

What the outcome carries besides energy: the power mode a Jetson ran in, a cap held when the session started
(`cap_at_start_mhz`), a pin above the mode's cap (`--above-mode-cap`), and where the energy comes from
(`energy_source`: an energy counter or the power samples).

The CPU and memory clocks (`--cpu-freq`, `--emc-freq`, `RunKnobs`): pinned with the GPU's, through the same session
(`hw.device.open_session`), each checked against its table (and on a Jetson the power mode's caps and the EMC floor)
before anything runs; the outcome carries each read back (`cpu_mhz_measured`, `emc_mhz`) and whether it held. nvml pins
the memory clock of each GPU the command uses and refuses a CPU clock; the twin refuses both for now.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops import settings
from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen, refuse_replay
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.device import KnobKeywords, knob_keywords
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.hw.multi import GpuEnergy

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device, FreqSession
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.hw.multi import GpuSessions, JobGpuSessions
    from dvfs_mlops.hw.nvml import NvmlDevice

# How often a running command's GPUs are looked for (`JobGpuSessions.attach`): a GPU is pinned at most this long after
# the command's first process appears on it.
ATTACH_POLL_S = 0.1
# What a session observed that `run --json` carries (absent keys are null).
CONTEXT_KEYS = ("nvpmodel_mode", "nvpmodel_gpu_max_mhz", "nvpmodel_tpc_pg_mask", "cap_at_start_mhz", "above_mode_cap",
                "clock_limits_at_start", "energy_counter_period_s", "power_source", "nvpmodel_cpu_max_mhz",
                "nvpmodel_emc_max_mhz", "cpu_khz_by_policy", "cpu_clock_source")


@dataclasses.dataclass(frozen=True)
class RunKnobs:
    """The CPU and memory clocks a command pins beside the GPU's (`--cpu-freq`, `--emc-freq`), MHz; None: left alone.

    Raises:
        DvfsError: a clock that is not a positive number of MHz (one line naming the option).
    """

    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    def __post_init__(self) -> None:
        for option, value in (("--cpu-freq", self.cpu_mhz), ("--emc-freq", self.emc_mhz)):
            if value is not None and not value > 0:
                raise DvfsError(f"{option} is a clock in MHz of the device's table, got {value:g}")

    def keywords(self) -> KnobKeywords:
        """The knobs given, as `Device.session` keywords."""
        return knob_keywords(self.cpu_mhz, self.emc_mhz)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What `dvfs-mlops run` measured: the clock asked for, the device, the command's exit code and the EnergyReport
    (with several GPUs, their sum: `hw.multi.combine`, and each GPU's own in `gpus`).

    Attributes:
        context: what the session observed besides energy (`CONTEXT_KEYS`): the power mode, a cap held at the start
            (`cap_at_start_mhz`), a pin above the mode's cap, the energy counter's update period.
        power_mode: the Jetson's power mode as a record (`hw.board.PowerMode.to_dict`), None elsewhere.
        found_by_use: the GPUs are those the command was seen using (CUDA_VISIBLE_DEVICES unset on several GPUs).
    """

    freq: str
    observe: bool
    device: str
    device_profile: str
    device_id: str | None
    returncode: int
    report: EnergyReport
    gpus: tuple[GpuEnergy, ...] = ()
    context: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    power_mode: Mapping[str, Any] | None = None
    found_by_use: bool = False
    knobs: RunKnobs = RunKnobs()

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: the request (`freq`, and `cpu_freq`, `emc_freq` in MHz, null where not pinned), the
        device, the exit code, every field of the report (`cpu_mhz_measured`, `cpu_held`, `emc_mhz`, `emc_held`
        included), `CONTEXT_KEYS` (null where not observed) and `power_mode`; with several GPUs (or GPUs found by use)
        the report is their sum, `gpus` lists each GPU's (index, uuid, host, key, report) and `gpu_count` how many."""
        several = ({"gpu_count": len(self.gpus), "gpus": [g.to_dict() for g in self.gpus]}
                   if len(self.gpus) > 1 or self.found_by_use else {})
        return {"freq": self.freq, "cpu_freq": self.knobs.cpu_mhz, "emc_freq": self.knobs.emc_mhz, "observe": self.observe,
                "device": self.device, "device_profile": self.device_profile,
                "device_id": self.device_id, "returncode": self.returncode, **self.report.to_dict(),
                **{k: self.context.get(k) for k in CONTEXT_KEYS}, "power_mode": self.power_mode, **several}

    def emit(self, as_json: bool, echo: Callable[..., Any]) -> int:
        """Print the outcome through `echo` (click.echo's signature): `notes` on stderr, then the `--json` object on
        stdout, or the `lines` on stderr.

        Returns:
            The command's exit code (the `run` command's own).
        """
        for line in self.notes() if as_json else self.lines():
            echo(line, err=True)
        if as_json:
            echo(json.dumps(self.to_json(), indent=2))
        return self.returncode

    def notes(self) -> list[str]:
        """What the session found that a reader must see (the power mode, a cap held at the start, a pin above the
        mode's cap), one line each: printed on stderr with `--json` too."""
        return _context_lines(self.context)

    def lines(self) -> list[str]:
        """What the command prints on stderr: `notes`, one line per GPU where there are several or they were found by
        use, and the one-line summary last (their sum)."""
        found = self.notes()
        if self.found_by_use and not self.gpus:
            return [*found, "the command used no GPU: NVML listed none of its processes, so nothing was pinned or metered",
                    self.line()]
        if len(self.gpus) <= 1 and not self.found_by_use:
            return [*found, self.line()]
        per_gpu = [f"GPU {g.index} ({g.key}){_attached(g)}: {_energy(g.report)}" for g in self.gpus]
        return [*found, *per_gpu, f"sum of {len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''}: {self.line()}"]

    def line(self) -> str:
        """The one-line summary (with several GPUs, of their sum)."""
        report = self.report
        label = " (SIMULATED)" if report.simulated else ""
        clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
        held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
        failed = f", {report.samples_failed} failed" if report.samples_failed else ""
        return (f"energy{label}: {report.energy_j:.2f} J CPU+GPU, {report.energy_total_j:.2f} J all rails, "
                f"{report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, peak {report.peak_power_w:.2f} W, "
                f"{report.samples} samples{failed}{clock}{held}{_knob_clocks(report, self.knobs)}"
                f"{' [observe]' if self.observe else ''}; exit code {self.returncode}")


def _knob_clocks(report: EnergyReport, knobs: RunKnobs) -> str:
    """The CPU and memory clocks read back where they were pinned, and whether each held."""
    held = {True: " (held)", False: " (did NOT hold)", None: ""}
    out = ""
    if knobs.cpu_mhz is not None and report.cpu_mhz_measured is not None:
        out += f", CPU {report.cpu_mhz_measured:.0f} MHz{held[report.cpu_held]}"
    if knobs.emc_mhz is not None and report.emc_mhz is not None:
        out += f", memory {report.emc_mhz:.0f} MHz{held[report.emc_held]}"
    return out


def _context_lines(context: Mapping[str, Any]) -> list[str]:
    out = []
    if context.get("nvpmodel_mode"):
        cap = context.get("nvpmodel_gpu_max_mhz")
        knob_caps = "".join(f", {name} cap {context[key]:g} MHz" for key, name in (("nvpmodel_cpu_max_mhz", "CPU"),
                                                                                  ("nvpmodel_emc_max_mhz", "EMC"))
                            if context.get(key) is not None)
        out.append(f"power mode {context['nvpmodel_mode']}" + (f" (GPU cap {cap:g} MHz{knob_caps})" if cap is not None
                                                               else f" (no GPU cap{knob_caps})"))
    if context.get("cap_at_start_mhz") is not None:
        out.append(f"the GPU was capped at {context['cap_at_start_mhz']:g} MHz when the session started (max_freq read below "
                   "the power mode's range): a thermal or other cap; a maxn run under it is not the board's MAXN")
    if context.get("clock_limits_at_start"):
        out.append(f"the GPU's clock was held down when the session started ({context['clock_limits_at_start']}, NVML's clock "
                   "event reasons): a maxn run under it is not the GPU's own default")
    if context.get("above_mode_cap"):
        out.append("pinned above the power mode's cap (--above-mode-cap): the board ran outside the mode's power budget")
    return out


def _attached(gpu: GpuEnergy) -> str:
    return f", used by the command, pinned {gpu.attached_after_s:.2f} s after its start" if gpu.attached_after_s is not None else ""


def _energy(report: EnergyReport) -> str:
    clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
    held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
    return f"{report.energy_j:.2f} J, {report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, {report.samples} samples{clock}{held}"


def run_command(freq: str, observe: bool, choice: DeviceChoice, command: Sequence[str],
                say: Callable[[str], None] = lambda _m: None, *, gpu_index_given: bool = False, all_gpus: bool = False,
                knobs: RunKnobs | None = None) -> RunOutcome:
    """`dvfs-mlops run`: check everything (the clocks, the command, the device), then run the command metered.

    Args:
        freq: a clock of the device's table in MHz, or 'maxn'; '' with `observe` (meter under the clocks as found).
        observe: meter only: write no clock, take no lock.
        choice: the device to run on.
        command: the program and its arguments (never a shell string).
        say: where the 'device: ...' line goes, once every check has passed.
        gpu_index_given: nvml: --gpu-index was given: that GPU alone.
        all_gpus: nvml: every GPU the command can see, from the start, even with CUDA_VISIBLE_DEVICES unset.
        knobs: the CPU and memory clocks to pin as well (None: neither).

    Returns:
        The `RunOutcome` (the command's exit code in it).

    Raises:
        DvfsError: a replay device (nothing to run), no --freq and no --observe, --gpu-index with --all-gpus, a clock
            not in its table, a knob the backend cannot set, an EMC clock below the board's floor, a command that does not
            exist, a device that cannot be opened, CUDA_VISIBLE_DEVICES naming some GPUs by index, several GPUs whose
            processes NVML cannot list, a pin above the power mode's cap (all before anything runs), or a refused clock
            write (every clock pinned before it is restored).
    """
    knobs = knobs or RunKnobs()
    refuse_replay(choice, "run")
    if not freq and not observe:
        raise DvfsError("give --freq MHZ (or maxn), or --observe to meter without touching the clock")
    if gpu_index_given and all_gpus:
        raise DvfsError("--gpu-index pins one GPU and --all-gpus every GPU: give one of them")
    from dvfs_mlops.hw import parse_freq
    from dvfs_mlops.hw.device import open_session

    dev = open_chosen(choice, load_twin(choice))
    freq = freq or "maxn"
    if dev.name == "nvml" and not gpu_index_given:
        from dvfs_mlops.hw.multi import open_visible

        devices = open_visible(cast("NvmlDevice", dev))
        if len(devices) > 1:
            if settings.cuda_visible_devices() is None and not all_gpus:
                return _run_on_used_gpus(devices, freq, observe, choice, list(command), say, knobs)
            return _run_on_gpus(devices, freq, observe, choice, list(command), say, knobs)
        dev = devices[0]
        if choice.device_id.strip():
            dev.device_id = choice.device_id.strip()
    pinned = parse_freq(freq, dev.frequencies_mhz)  # bad input is an error before anything is announced or run
    session = open_session(dev, freq, observe=observe, **knobs.keywords())  # each knob in its table, or refused
    if dev.name == "jetson" and not observe:  # the session checks again; refused here before any line
        jetson = cast("JetsonDevice", dev)
        mode = jetson.power_mode()
        if pinned != "maxn":
            jetson.check_mode_cap(float(pinned), mode)
        if knobs.keywords():
            jetson.check_knobs(session.cpu_mhz, session.emc_mhz, mode, refuse_above_cap=True)
    check_command(list(command))
    say(announcement(dev, choice))
    rc = run_in(session, list(command))
    mode = getattr(session, "power_mode", None)
    return RunOutcome(freq, observe, dev.name, dev.profile, getattr(dev, "device_id", None), rc, session.report(),
                      context=dict(session.context), power_mode=mode.to_dict() if mode is not None else None, knobs=knobs)


def _check_gpus(devices: list[NvmlDevice], freq: str, observe: bool, command: list[str], knobs: RunKnobs) -> None:
    """Every check of a several-GPU run before anything is pinned: the clocks in each GPU's tables, each GPU pinnable
    (MIG, application clocks, --assume-unlocked), the command."""
    from dvfs_mlops.hw import parse_freq
    from dvfs_mlops.hw.device import open_session

    for dev in devices:
        try:
            if (parse_freq(freq, dev.frequencies_mhz) != "maxn" or knobs.keywords()) and not observe:
                dev.check_can_pin()
            open_session(dev, freq, observe=observe, **knobs.keywords())  # each knob in the GPU's table, or refused
        except DvfsError as e:
            raise DvfsError(f"GPU {dev.index} ({dev.gpu_name}): {e}") from None
    check_command(command)


def _run_on_gpus(devices: list[NvmlDevice], freq: str, observe: bool, choice: DeviceChoice, command: list[str],
                 say: Callable[[str], None], knobs: RunKnobs) -> RunOutcome:
    """`run` on several GPUs: every check first (the clocks in each GPU's tables, the command), then each pinned in NVML
    index order, the command run once, each restored; the outcome holds each GPU's report and their sum."""
    from dvfs_mlops.hw.multi import GpuSessions, combine

    try:
        _check_gpus(devices, freq, observe, command, knobs)
        for dev in devices:
            say(announcement(dev, choice))
        sessions = GpuSessions(devices, freq, observe=observe, **knobs.keywords())
        rc = run_in(sessions, command)
        gpus = tuple(sessions.reports())
    finally:
        for dev in devices:
            dev.close()
    names = {dev.profile for dev in devices}
    return RunOutcome(freq, observe, "nvml", ",".join(sorted(names)),
                      choice.device_id.strip() or None, rc, combine([g.report for g in gpus]), gpus,
                      context=_common_context([s.context for s in sessions.sessions]), knobs=knobs)


def _run_on_used_gpus(devices: list[NvmlDevice], freq: str, observe: bool, choice: DeviceChoice, command: list[str],
                      say: Callable[[str], None], knobs: RunKnobs) -> RunOutcome:
    """`run` on a box of several GPUs with CUDA_VISIBLE_DEVICES unset: every check first (each GPU's table, each GPU
    pinnable, NVML lists each GPU's processes, the command), then the command started and each GPU it uses pinned and
    metered from when it is seen on it (`JobGpuSessions`); idle GPUs are never pinned and never enter the energy."""
    import time

    from dvfs_mlops.hw.multi import JobGpuSessions, combine

    try:
        _check_gpus(devices, freq, observe, command, knobs)
        jobs = JobGpuSessions(devices, freq, observe=observe, **knobs.keywords())
        jobs.check()
        say(f"device: nvml ({len(devices)} GPUs, CUDA_VISIBLE_DEVICES unset): pinning and metering the GPUs the command's "
            "processes use, as NVML lists them")
        t0 = time.monotonic()
        rc = run_in_job(jobs, command)
        wall = time.monotonic() - t0
        gpus = tuple(jobs.reports())
    finally:
        for dev in devices:
            dev.close()
    if gpus:
        report = combine([g.report for g in gpus])
        profile = ",".join(sorted({dev.profile for dev, _s, _t in jobs.attached}))
    else:
        report = EnergyReport(wall, 0.0, 0.0, {}, 0.0, 0.0, None, 0, False)
        profile = ",".join(sorted({dev.profile for dev in devices}))
    device_id = choice.device_id.strip() or (gpus[0].uuid if len(gpus) == 1 else None)
    return RunOutcome(freq, observe, "nvml", profile, device_id, rc, report, gpus,
                      context=_common_context([s.context for _d, s, _t in jobs.attached]), found_by_use=True, knobs=knobs)


def _common_context(contexts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The observations every GPU's session shares (the same value on each)."""
    if not contexts:
        return {}
    return {k: v for k, v in contexts[0].items() if all(c.get(k) == v for c in contexts[1:])}


def run_metered(device: Device, freq: str, command: list[str], observe: bool = False) -> tuple[int, EnergyReport]:
    """Run `command` (an argv list, never a shell string) inside a FreqSession (`observe`: meter only).

    SIGINT/SIGTERM reaching us are forwarded to the child; the session restores the clock on the
    way out whatever happens.
    """
    check_command(command)
    session = device.session(freq, observe=observe)
    return run_in(session, command), session.report()


def run_in(session: FreqSession | GpuSessions, command: list[str]) -> int:
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


def run_in_job(jobs: JobGpuSessions, command: list[str]) -> int:
    """Run `command` inside `jobs` (`JobGpuSessions`), attaching the GPUs its processes use every `ATTACH_POLL_S` until
    it ends; its exit code (128+N for a signal N). A refused pin stops the command (SIGTERM) and restores the GPUs
    attached before it."""
    with jobs:
        proc = subprocess.Popen(command)
        try:
            while True:
                if not jobs.complete:
                    jobs.attach(proc.pid)
                try:
                    rc = proc.wait(timeout=ATTACH_POLL_S if not jobs.complete else None)
                    break
                except subprocess.TimeoutExpired:
                    continue
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
