"""The one launch controller: decide -> pin -> warm-up/windows -> refine -> report, for every metered job.

`dvfs-mlops finetune`, a sweep point and `DvfsCallback` run a job the same way:
- decide (`decide`): what decides on this board (`governor.governor_for_board`: the family's production governor,
  another family's with `allow_other_board`, or none, where refine picks the clock), the workload's GPU utilisation
  (the caller's way to measure it), the clock, as one `Decision`; a sweep point's clock is fixed (`Decision.fixed`);
- pin, warm-up/windows and refine (`Launch`): the session at the decided clock, the first steps metered apart as
  "warmup" and the rest as "train" (`job.finetune.StepWindows`), and probe-and-refine (`job.refine.Refiner`) with the
  step budget `refine_budget` gives (the board's default: 30 steps on hardware, none on the twin);
- report: the session's `EnergyReport` and what refine did, for `records` to log.
`Launch.run` drives a `job.run.Job` (finetune, a point: `run_job` is the loop); `Launch.begin`/`step_done`/`end`
drive a loop someone else owns (the user's `Trainer`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN, FreqRequest, Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.finetune import StepWindows, num_steps
from dvfs_mlops.job.run import run_job
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.governor import Choice, GovernorRef

if TYPE_CHECKING:
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.hw.device import Device, FreqSession
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.hw.twin.trace import StepTrace
    from dvfs_mlops.job.finetune import FinetuneResult
    from dvfs_mlops.job.refine import Refiner, RefineResult
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.mlops.governor import BoardGovernor
    from dvfs_mlops.model.workload import WorkloadFeatures

log = logging.getLogger(__name__)

# Probe-and-refine's step budget on real boards unless told (`refine_budget`); the twin's steps cost what its model
# says at every clock, so it refines only when asked.
HARDWARE_REFINE_STEPS = 30
# ... and at least this where no governor of the board's family decides: the curve model, fitted to the probes, is then
# all that picks the clock.
NO_GOVERNOR_REFINE_STEPS = 30
# With the CPU or memory clock tuned too (`--knobs gpu,cpu[,emc]`), refine walks their axes after the GPU's: at least
# this budget unless told.
JOINT_REFINE_STEPS = 60


def default_refine(board: Board) -> int:
    """The probe budget a job uses unless told: 30 steps on real boards, none on the twin."""
    return 0 if board.simulated else HARDWARE_REFINE_STEPS


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How a job decides and runs (besides the job itself): the launcher's options, and `DvfsCallback`'s.

    Attributes:
        governor_uri: the governor to ask (None: the board family's production version).
        probe_steps: steps at maxn that measure the GPU utilisation feature; 0: the twin's estimate. (`DvfsCallback`
            cannot probe, the user's `Trainer` being the loop: it takes its `gpu_util_pct`, else the twin's estimate.)
        dry_run: stop after the decision (nothing trained or logged).
        strict: refuse a governor trained for another device profile.
        save_model: log the fine-tuned model as an artifact.
        observe: meter only, write no clock (no root needed); no refine.
        refine: probe-and-refine's step budget (None: the board's default, `default_refine`; 0: off).
        announce_device: say which device runs the job.
        allow_other_board: a governor of another board family may decide (recorded on the run).
        warmup_steps: the first steps metered apart (None: 3 on hardware, 0 on the twin; at most a quarter).
        tuned: the clocks tuned (`--knobs`): "gpu", "gpu,cpu", "gpu,cpu,emc"; refine tunes the CPU and memory clocks
            online from their tops after the GPU's (at least `JOINT_REFINE_STEPS` unless told).
    """

    governor_uri: str | None = None
    probe_steps: int = 5
    dry_run: bool = False
    strict: bool = False
    save_model: bool = True
    observe: bool = False
    refine: int | None = None
    announce_device: bool = False
    allow_other_board: bool = False
    warmup_steps: int | None = None
    tuned: str = "gpu"

    def __post_init__(self) -> None:
        """An unknown clock in `tuned`, or no gpu among them: refused when the options are made (one line)."""
        from dvfs_mlops.mlops.sweep.spec import parse_tuned

        parse_tuned(self.tuned)

    @property
    def tuned_knobs(self) -> tuple[str, ...]:
        """The clocks tuned, checked (`sweep.spec.parse_tuned`): ("gpu",), ("gpu", "cpu"), ...

        Raises:
            DvfsError: an unknown clock, or the GPU's not among them.
        """
        from dvfs_mlops.mlops.sweep.spec import parse_tuned

        return parse_tuned(self.tuned)

    def knob_tables(self, device: Device) -> dict[str, list[float]]:
        """The tables of the CPU and memory clocks tuned ({"cpu_mhz": [...], ...}), from the device.

        Raises:
            DvfsError: a tuned clock the backend cannot set (one line), `--observe` with one (nothing is pinned), or
                refine off (`--refine 0`), which is what tunes them.
        """
        from dvfs_mlops.hw.device import knob_table

        if self.tuned_knobs != ("gpu",) and self.refine == 0:
            raise DvfsError(f"--knobs {self.tuned}: refine tunes the CPU and memory clocks online, and --refine 0 turns it off; "
                            f"drop --refine 0 (default {JOINT_REFINE_STEPS} steps) or --knobs")
        out = {}
        for knob in self.tuned_knobs[1:]:
            table = sorted(knob_table(device, f"{knob}_mhz"))
            if not table:
                raise DvfsError(f"--knobs {self.tuned}: the {device.name} backend cannot set the {knob.upper()} clock; drop {knob} "
                                "from --knobs, or use a device that sets it (jetson, sim)")
            if self.observe:
                raise DvfsError(f"--knobs {self.tuned}: --observe pins nothing, so no clock is tuned; drop one of them")
            out[f"{knob}_mhz"] = table
        return out


@dataclasses.dataclass(frozen=True)
class Decision:
    """The clock a job runs at, and why: the one decision type of the launcher, a sweep point and `DvfsCallback`.

    Attributes:
        freq_mhz: the clock (MHz), or "maxn" where a caller fixed it so.
        path: the decision path ("num_layers=12 > 7, avg_seq_len=71.3 > 53 -> 816 MHz"), "refine", or why it is fixed.
        governor: which governor decided (`GovernorRef("")` where none did).
        features: the workload's features it decided on (None for a fixed clock).
        expected_saving: the twin's estimate of the saving against maxn (SIMULATED), where known.
        util_source: how `gpu_util_pct` was obtained.
        family: the board's family ('' for a fixed clock).
        reason: why no governor of the family decided ('' where one did): refine then picks the clock.
        other_board: a governor of another family decided (--allow-other-board).
        fixed: the caller fixed the clock (a sweep point, `DvfsCallback(freq=...)`): no governor was asked.
        cpu_mhz: the CPU clock pinned with the GPU's (a configuration); None: left alone.
        emc_mhz: the memory (EMC) clock pinned with the GPU's; None: left alone.
    """

    freq_mhz: FreqRequest
    path: str
    governor: GovernorRef = dataclasses.field(default_factory=lambda: GovernorRef(""))
    features: WorkloadFeatures | None = None
    expected_saving: float | None = None
    util_source: str = ""
    family: str = ""
    reason: str = ""
    other_board: bool = False
    fixed: bool = False
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    @classmethod
    def of(cls, chosen: BoardGovernor, choice: Choice | None = None) -> Decision:
        """What `governor.governor_for_board` resolved, and what it decided (`Choice`: the GPU clock, and a governor of
        configurations' CPU and memory clocks); without `choice`, before it decides (maxn until `decide` fills it in)."""
        plan = cls(MAXN, "", chosen.ref, family=chosen.family, reason=chosen.note if chosen.governor is None else "",
                   other_board=chosen.other_board)
        if choice is None:
            return plan
        return dataclasses.replace(plan, freq_mhz=choice.freq_mhz, path=choice.path, cpu_mhz=choice.cpu_mhz, emc_mhz=choice.emc_mhz)

    @classmethod
    def at(cls, freq: FreqRequest, why: str = "", *, cpu_mhz: float | None = None, emc_mhz: float | None = None) -> Decision:
        """A clock (or configuration) the caller fixed (a sweep point's, `DvfsCallback(freq=...)`)."""
        return cls(freq, why or f"fixed by the caller: {freq}", fixed=True, cpu_mhz=cpu_mhz, emc_mhz=emc_mhz)

    @property
    def setting(self) -> Setting | None:
        """The configuration decided (None at maxn, which pins nothing)."""
        return None if self.freq_mhz == MAXN else Setting(float(self.freq_mhz), self.cpu_mhz, self.emc_mhz)

    def with_knobs_at_top(self, tables: Mapping[str, Sequence[float]]) -> Decision:
        """The decision with each tuned CPU or memory clock it leaves open at its table's top (refine's start)."""
        tops: dict[str, Any] = {k: float(max(t)) for k, t in tables.items() if t and getattr(self, k) is None}
        return dataclasses.replace(self, **tops) if tops else self

    def knob_clocks(self) -> dict[str, float]:
        """The CPU and memory clocks decided with the GPU's, by their JSON names (cpu_mhz, emc_mhz), where set."""
        return {k: v for k, v in (("cpu_mhz", self.cpu_mhz), ("emc_mhz", self.emc_mhz)) if v is not None}

    def open_session(self, device: Device, observe: bool, label: str) -> FreqSession:
        """The session at the decided configuration (`hw.device.open_session`: a CPU or memory clock the backend cannot
        set is one line before anything is touched)."""
        from dvfs_mlops.hw.device import open_session

        return open_session(device, self.freq_mhz, observe=observe, label=label, cpu_mhz=self.cpu_mhz, emc_mhz=self.emc_mhz)

    @property
    def refines_without_governor(self) -> bool:
        """No governor of the board's family: the clock is refine's start, and refine picks the one the job runs at."""
        return not self.fixed and not self.governor.uri

    def refine_budget(self, requested: int | None, default: int) -> int:
        """Refine's step budget: the requested one (None: `default`); where no governor decided, refine is what picks
        the clock, so its budget is at least `NO_GOVERNOR_REFINE_STEPS` unless refine was turned off.

        Raises:
            DvfsError: no governor and refine turned off (0): nothing would pick the clock.
        """
        if not self.refines_without_governor:
            return default if requested is None else requested
        if requested == 0:
            raise DvfsError(f"no production governor for {self.family} and refine is off (0 steps): nothing would pick the "
                            "clock; drop --refine 0, or run `dvfs-mlops calibrate`, or pass --allow-other-board")
        return max(requested or 0, NO_GOVERNOR_REFINE_STEPS)

    def tags(self) -> dict[str, str]:
        """What a run records of the decision: the governor, the path, the family, and why none decided or that
        another family's did."""
        g = self.governor
        tags = {schema.TAG_GOVERNOR_NAME: str(g.name or ""), schema.TAG_GOVERNOR_VERSION: str(g.version or ""),
                schema.TAG_GOVERNOR_ALIAS: str(g.alias or ""), schema.TAG_GOVERNOR_URI: g.uri,
                schema.TAG_DECISION_PATH: self.path[:5000]}
        if self.family:
            tags[schema.TAG_BOARD_FAMILY] = self.family
        if self.reason:
            tags[schema.TAG_DECISION_REASON] = self.reason[:5000]
        if self.other_board:
            tags[schema.TAG_OTHER_BOARD] = "true"
        return tags

    def to_dict(self) -> dict[str, Any]:
        """The decision as JSON (`finetune --json`)."""
        out: dict[str, Any] = {"freq_mhz": self.freq_mhz, **self.knob_clocks(), "path": self.path, "governor": self.governor.to_dict(),
                               "features": self.features.as_row() if self.features is not None else None,
                               "expected_saving_vs_maxn": self.expected_saving, "expected_saving_simulated": True,
                               "gpu_util_source": self.util_source}
        if self.family:
            out.update({"board_family": self.family, "other_board": self.other_board})
        if self.reason:
            out["reason"] = self.reason
        return out

    def lines(self) -> list[str]:
        """The decision as the launcher says it: the governor, the features, the path, the twin's expected saving."""
        out = []
        if not self.fixed:
            out.append("governor: " + (self.governor.label if self.governor.uri else f"none for {self.family or '?'}"))
        if self.features is not None:
            shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.features.as_row().items()]
            out.append("features: " + ", ".join(shown) + (f"  [gpu util: {self.util_source}]" if self.util_source else ""))
        start = f", starting at {self.freq_mhz:g} MHz" if self.refines_without_governor and self.freq_mhz != MAXN else ""
        out.append(f"decision: {self.path}{start}")
        if self.expected_saving is not None:
            out.append(f"expected saving vs maxn: {100 * self.expected_saving:.1f}% (twin estimate, SIMULATED)")
        return out


def decide(board: Board, options: LaunchOptions, features: WorkloadFeatures, measure_util: Callable[[], tuple[float | None, str]],
           say: Callable[[str], None], device: Device | None = None) -> Decision:
    """Resolve what decides on this board, measure the workload's utilisation, decide.

    A missing store or governor URI is an error before the device is used; no governor of the family is one line
    (`say`), then refine picks the clock (its budget checked here, before any clock is touched). A governor of
    configurations decides the CPU and memory clocks too, each snapped to the device's table; one the device cannot
    set (NVML's CPU clock), or any under `observe`, is left as it is, in one line (`applicable`), and the GPU clock is
    applied.

    Args:
        board: the board.
        options: the governor, strictness, other boards, refine.
        features: the workload's features (`gpu_util_pct` is filled from `measure_util`).
        measure_util: measures `gpu_util_pct` at maxn: (percent or None, how it was obtained).
        say: where the notes go.
        device: the open device (its CPU and memory clock tables); None: a governor's CPU and memory clocks are not
            applied (said in one line).

    Returns:
        The `Decision`.

    Raises:
        DvfsError: as `governor_for_board`; no governor and refine 0; the governor cannot decide.
    """
    from dvfs_mlops.mlops.governor import governor_for_board

    chosen = governor_for_board(board, options.governor_uri, allow_other_board=options.allow_other_board,
                                strict=options.strict, say=say)
    if chosen.note:
        say(chosen.note)
    plan = Decision.of(chosen)
    if not options.observe:
        plan.refine_budget(options.refine, default_refine(board))  # no governor and --refine 0: refused here
    util, source = measure_util()
    feats = features.with_gpu_util(util)
    tables = device_knob_tables(device)
    choice = chosen.decide(feats, board, cpu_frequencies=tables.get("cpu_mhz") or None, emc_frequencies=tables.get("emc_mhz") or None)
    choice = applicable(choice, tables, device.name if device is not None else "", options.observe, chosen.ref.label, say)
    return dataclasses.replace(Decision.of(chosen, choice), features=feats, util_source=source)


def device_knob_tables(device: Device | None) -> dict[str, list[float]]:
    """The CPU and memory clock tables of the device ({"cpu_mhz": [...], "emc_mhz": [...]}; [] where it has none)."""
    from dvfs_mlops.hw.device import KNOBS, knob_table

    return {k: sorted(knob_table(device, k)) if device is not None else [] for k in KNOBS}


def applicable(choice: Choice, tables: Mapping[str, Sequence[float]], backend: str, observe: bool, governor: str,
               say: Callable[[str], None]) -> Choice:
    """The choice with each CPU or memory clock the job cannot pin left alone (None), said in one line: the device has
    no table for it (NVML's CPU clock), or `observe` pins nothing. The GPU clock is applied either way."""
    from dvfs_mlops.hw.device import KNOBS

    dropped = {}
    for knob in KNOBS:
        value = getattr(choice, knob)
        if value is None:
            continue
        if observe or not tables.get(knob):
            dropped[knob] = value
    if not dropped:
        return choice
    shown = " and ".join(f"{KNOBS[k][0]} {v:g} MHz" for k, v in dropped.items())
    why = "--observe pins nothing" if observe else f"the {backend or 'device'} backend cannot set {'it' if len(dropped) == 1 else 'them'}"
    say(f"governor {governor} chose the {shown} with {choice.freq_mhz:g} MHz; {why}, so "
        f"{'it stays' if len(dropped) == 1 else 'they stay'} as found and the GPU clock is applied")
    return dataclasses.replace(choice, cpu_mhz=None if "cpu_mhz" in dropped else choice.cpu_mhz,
                               emc_mhz=None if "emc_mhz" in dropped else choice.emc_mhz).relabelled()  # the path: what is pinned


def refine_budget(decision: Decision, options: LaunchOptions, board: Board, say: Callable[[str], None],
                  ranks: int = 1) -> int:
    """The probe-and-refine budget a job runs with: the decision's (`Decision.refine_budget` with the board's
    default), none where nothing is pinned (observe, maxn) or several ranks run the job (each would settle on a clock
    of its own); each of those said in one line when a budget was asked for."""
    # a caller's clock (a sweep point): refine only when asked
    budget = (options.refine or 0) if decision.fixed else decision.refine_budget(options.refine, default_refine(board))
    if options.tuned_knobs != ("gpu",) and not decision.fixed and options.refine is None:
        budget = max(budget, JOINT_REFINE_STEPS)  # refine is what tunes the CPU and memory clocks
    if not budget:
        return 0
    if options.observe:
        say("refine: off under --observe (nothing is pinned, so there is no clock to move)")
        return 0
    if decision.freq_mhz == MAXN:
        say("refine: off, nothing is pinned (maxn), so there is no clock to move")
        return 0
    if ranks > 1:
        say("refine: off under a launcher with several ranks, which would each settle on a clock of their own")
        return 0
    return budget


@dataclasses.dataclass
class Launched:
    """What a launched job did: its session (exited), the job's result where `Launch.run` ran it, and refine's."""

    session: FreqSession
    result: FinetuneResult | None
    refined: RefineResult | None

    @property
    def settled_mhz(self) -> FreqRequest:
        """The clock the job ran at after refine (the session's pin otherwise; maxn or the observed clock as given)."""
        return self.refined.chosen_mhz if self.refined is not None else self.session.freq

    @property
    def report(self) -> EnergyReport:
        """The "train" window's report (the steps after warm-up)."""
        return self.session.report()

    def knob_params(self) -> dict[str, str]:
        """The CPU and memory clocks the job ran at after refine, as a run records them beside `freq_mhz`
        (`cpu_freq_mhz`, `emc_freq_mhz`), where pinned."""
        s = self.session
        return {f"{k[:3]}_freq_mhz": f"{v:g}" for k, v in (("cpu_mhz", s.pinned_cpu_mhz), ("emc_mhz", s.pinned_emc_mhz)) if v is not None}


class Launch:
    """One job pinned at a decided clock: the session, its warm-up and training windows, and refine.

    Args:
        device: the open device.
        board: its board.
        decision: the clock and why.
        refine: probe-and-refine's budget (`refine_budget`; 0: off).
        observe: meter only.
        label: what the session measures (the twin's noise is drawn from it).
        say: where refine's lines go.
        knobs: the CPU and memory clock tables refine tunes after the GPU's (`LaunchOptions.knob_tables`; empty: none).
    """

    def __init__(self, device: Device, board: Board, decision: Decision, *, refine: int = 0, observe: bool = False,
                 label: str = "", say: Callable[[str], None] | None = None, knobs: Mapping[str, Sequence[float]] | None = None):
        self.device, self.board, self.decision = device, board, decision
        self.knobs = dict(knobs or {})
        self.budget, self.observe, self.label = refine, observe, label
        self.say = say or log.info
        self.session: FreqSession | None = None
        self._refiner: Refiner | None = None
        self._windows: StepWindows | None = None

    def _refiner_for(self, total_steps: int, warmup: int) -> Refiner | None:
        if not self.budget or self.session is None:
            return None
        from dvfs_mlops.job.refine import WARMUP_STEPS, Refiner

        prior = self.decision.governor.power_prior_for(self.board) if self.decision.governor.uri else None
        return Refiner(self.session, self.budget, total_steps, self.board, prior=prior, say=self.say,
                       warmup=max(WARMUP_STEPS, warmup), knobs=self.knobs)

    def run(self, job: Job, *, mode: str = "train", replay_of: FinetuneResult | None = None) -> Launched:
        """Pin, run `job` (`job.run.run_job`: its loop meters the windows), refine from its steps, restore.

        Returns:
            The `Launched` job (its result included).
        """
        self.session = self.decision.open_session(self.device, self.observe, self.label)
        with self.session:
            total = num_steps(job.config, job.workload.n_train) if self.budget else 0
            self._refiner = self._refiner_for(total, job.config.cold_steps(total))
            result = run_job(job, self.session, mode=mode, replay_of=replay_of,
                             on_step=self._refiner.on_step if self._refiner is not None else None)
        return Launched(self.session, result, self.refined)

    def begin(self, total_steps: int, warmup: int) -> FreqSession:
        """Pin and open the windows for a loop someone else runs (`step_done` after each step, `end` after the last).

        Args:
            total_steps: the steps the loop will run (refine leaves at least one at the settled clock).
            warmup: the first steps metered apart as "warmup".

        Returns:
            The entered session.
        """
        self.session = self.decision.open_session(self.device, self.observe, self.label)
        self.session.__enter__()
        try:
            self._windows = StepWindows(self.session, self.board.torch_device, warmup).__enter__()
            self._refiner = self._refiner_for(total_steps, warmup)
        except BaseException:
            self.session.__exit__(None, None, None)
            raise
        return self.session

    def step_done(self, step: int, trace: StepTrace | None = None) -> None:
        """After the loop's step `step` (0-based): the twin charges `trace`, refine moves on, the windows turn."""
        if self.session is None or self._windows is None:
            return
        if self.device.simulated:
            self.session.step(trace)
        if self._refiner is not None:
            self._refiner.on_step(step)
        self._windows.step_done(step)

    def end(self) -> Launched | None:
        """Close the windows, stop metering and restore the clock (idempotent: None once ended)."""
        if self.session is None or self._windows is None:
            return None
        session, windows, self._windows = self.session, self._windows, None
        try:
            windows.__exit__(None, None, None)
        finally:
            session.__exit__(None, None, None)
        return Launched(session, None, self.refined)

    @property
    def refined(self) -> RefineResult | None:
        """What probe-and-refine did (None without it)."""
        return self._refiner.result if self._refiner is not None else None
