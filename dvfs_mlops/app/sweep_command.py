"""`dvfs-mlops sweep`: check the request, open the claims and the device, build the sweep on its board, run it.

Everything a user can get wrong is refused before any clock is touched, cheapest first: the names (no store, no
device), the tracking store, the claims database, the device and its CUDA, then the sweep's definition on the board.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen
from dvfs_mlops.app.links import link_lines
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.mlops.sweep import SweepOutcome, SweepRequest
    from dvfs_mlops.mlops.sweep.artifacts import WorkloadPick
    from dvfs_mlops.mlops.sweep.spec import SweepSpec

# --knobs (sweep, finetune) and --strategy: their help, as the options show it.
TUNED_HELP = ("The clocks tuned: gpu (default), gpu,cpu (with the CPU clock: cpufreq) or gpu,cpu,emc (and the memory clock: EMC); "
              "jetson, sim and replay grids with those columns set them. sweep: each point is one configuration; finetune: refine "
              "walks the CPU and memory clocks down from their tops after the GPU's (at least 60 steps unless --refine says).")
STRATEGY_HELP = "grid: every clock (configuration); adaptive: maxn and <= 4 clocks per workload (--knobs gpu,cpu...: <= 20 configurations)."


@dataclasses.dataclass(frozen=True)
class SweepWorker:
    """How this worker runs a sweep, as the command line asks (none of it is the sweep's identity).

    Attributes:
        settle_s: on hardware, seconds to idle before each point after the first.
        observe: asked for --observe, which a sweep refuses (it exists to pin each clock).
        claims_uri: where workers claim points ('': $DVFS_CLAIMS_URI, else beside the tracking store; 'none').
        claim_ttl_s: a claim's lease after its last heartbeat.
    """

    settle_s: float = 0.0
    observe: bool = False
    claims_uri: str = ""
    claim_ttl_s: float = 120.0


@dataclasses.dataclass(frozen=True)
class SweepReport:
    """What `dvfs-mlops sweep` did: the runner's outcome, how its points were measured (' (SIMULATED)',
    ' (REPLAYED)' or ''), the MLflow UI link lines, and what it recommends per workload (`sweep --json`)."""

    outcome: SweepOutcome
    label: str
    link: list[str]
    picks: list[WorkloadPick] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        """The summary line: points run, found finished, run by other workers; the parent run."""
        out = self.outcome
        label = self.label
        others = f", {len(out.by_others)} were run by other workers" if out.by_others else ""
        return [(f"sweep {out.sweep_id}{label}: ran {len(out.ran)} points, {len(out.skipped)} were already finished{others}; "
                 f"parent run {out.parent_run_id} in experiment {out.experiment or out.experiment_id}")]

    def emit(self, as_json: bool, echo: Callable[..., Any]) -> None:
        """Print the summary and the link lines (on stderr with `as_json`), then, with `as_json`, one JSON object per
        workload on stdout: `{"workload", "best": {"gpu_mhz", "energy_j", "time_s"}, "points_measured"}`."""
        for line in [*self.lines(), *self.link]:
            echo(line, err=as_json)
        for pick in self.picks if as_json else []:
            echo(json.dumps(pick.to_json()))


def run_sweep_command(request: SweepRequest, choice: DeviceChoice, worker: SweepWorker,
                      say: Callable[[str], None] = lambda _m: None, with_best: bool = False) -> SweepReport:
    """`dvfs-mlops sweep`: check, open, build and run (or resume) the sweep on this worker.

    Args:
        request: the preset and its overrides.
        choice: the device to sweep.
        worker: settle time and claims.
        say: where the device line and the sweep's progress go.
        with_best: read each workload's best configuration back (`sweep --json`).

    Returns:
        The `SweepReport`.

    Raises:
        DvfsError: --observe, an unknown name, an unreachable store or claims database, twin options on real
            hardware, a definition the board cannot run (all before any clock is touched), or a failed point.
    """
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.mlops import sweep as sweep_mod
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.claims import open_claims

    if worker.observe:
        raise DvfsError("a sweep exists to pin each clock, so it has no --observe; meter a job as found with "
                        "`dvfs-mlops finetune --observe` or `dvfs-mlops run --observe -- CMD`")
    twin = load_twin(choice)
    sweep_mod.check_request(request)  # a typo: at once
    tracking.check_reachable()  # before the device is even opened
    claims = open_claims(worker.claims_uri or None, tracking.tracking_uri())  # an unreachable claims database: before any clock too
    dev = open_chosen(choice, twin)
    board = board_of(dev, choice.torch_device or None)
    spec = sweep_mod.build_spec(board, request, dev, grid=cast("ReplayDevice", dev).grid if dev.name == "replay" else None)
    say(announcement(dev, choice))
    start_clock = adaptive_start(board, say) if request.strategy == "adaptive" else None
    options = sweep_mod.RunOptions(announce=say, settle_s=worker.settle_s, start_clock=start_clock, claims=claims,
                                   claim_ttl_s=worker.claim_ttl_s)
    out = sweep_mod.run_sweep(spec, dev, board, options)  # through the package: tests replace it there
    link = link_lines(lambda: tracking.experiment_link(out.experiment_id))  # the runs table: expand the parent run for its points
    from dvfs_mlops.mlops.sweep.progress import device_label

    return SweepReport(out, device_label(board), link, _picks(out, spec, dev, board) if with_best else [])


def _picks(out: SweepOutcome, spec: SweepSpec, dev: Device, board: Board) -> list[WorkloadPick]:
    """What the sweep recommends per workload (`sweep --json`): a GPU-only sweep's measured minimum (grid) or curve-model
    pick (adaptive); a sweep that tunes CPU or memory clocks, its best measured configuration (a replay grid's clocks as
    its file writes them)."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.sweep.artifacts import workload_picks

    if not spec.joint:
        return workload_picks(out.experiment_id, out.sweep_id, board, spec.strategy)
    from dvfs_mlops.mlops.sweep.best import sweep_best

    played = (lambda s: dev.setting(s.gpu_mhz, s.cpu_mhz, s.emc_mhz)) if dev.name == "replay" else None  # type: ignore[attr-defined]
    return sweep_best(tracking.client(), out.experiment_id, out.sweep_id, played)


def adaptive_start(board: Board, say: Callable[[str], None]) -> Callable[[Any], float | None] | None:
    """The production governor's clock for a workload's features (the board family's), where an adaptive sweep starts.

    Args:
        board: the board swept (its clock table).
        say: where the line saying which governor (or none) goes.

    Returns:
        features -> clock; None without a production governor (each workload starts at the middle of the table).
    """
    from dvfs_mlops.mlops.governor import load_governor

    try:
        governor = load_governor(None, board=board)  # this board family's: another board's clocks would mislead
    except DvfsError as e:
        say(f"adaptive sweep: no production governor ({str(e).splitlines()[0][:120]}); each workload starts at the middle of the table")
        return None
    say(f"adaptive sweep: each workload starts at the clock of {governor.ref.name} v{governor.ref.version}")
    return lambda features: governor.decide(features, board.frequencies_mhz).freq_mhz
