"""`dvfs-mlops sweep`: check the request, open the claims and the device, build the sweep on its board, run it.

Everything a user can get wrong is refused before any clock is touched, cheapest first: the names (no store, no
device), the tracking store, the claims database, the device and its CUDA, then the sweep's definition on the board.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen
from dvfs_mlops.app.links import link_lines
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.mlops.sweep import SweepOutcome, SweepRequest
    from dvfs_mlops.mlops.sweep.best import WorkloadBest

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
    """What `dvfs-mlops sweep` did: the runner's outcome, whether it ran on the twin, and the MLflow UI link lines."""

    outcome: SweepOutcome
    simulated: bool
    link: list[str]
    workloads: list[WorkloadBest] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        """The summary line: points run, found finished, run by other workers; the parent run."""
        out = self.outcome
        label = " (SIMULATED)" if self.simulated else ""
        others = f", {len(out.by_others)} were run by other workers" if out.by_others else ""
        return [(f"sweep {out.sweep_id}{label}: ran {len(out.ran)} points, {len(out.skipped)} were already finished{others}; "
                 f"parent run {out.parent_run_id} in experiment {out.experiment or out.experiment_id}")]

    def to_json(self) -> dict[str, Any]:
        """`sweep --json`: the outcome and, per workload, its best measured configuration (`best`: freq_mhz, cpu_mhz,
        emc_mhz, energy_j, time_s), how many configurations were measured, and the saving against maxn."""
        out = self.outcome
        return {"sweep_id": out.sweep_id, "simulated": self.simulated, "parent_run_id": out.parent_run_id,
                "experiment": out.experiment or out.experiment_id, "ran": len(out.ran), "already_finished": len(out.skipped),
                "by_other_workers": len(out.by_others), "workloads": [w.to_dict() for w in self.workloads]}


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
    spec = sweep_mod.build_spec(board, request, dev)
    say(announcement(dev, choice))
    start_clock = adaptive_start(board, say) if request.strategy == "adaptive" else None
    options = sweep_mod.RunOptions(announce=say, settle_s=worker.settle_s, start_clock=start_clock, claims=claims,
                                   claim_ttl_s=worker.claim_ttl_s)
    out = sweep_mod.run_sweep(spec, dev, board, options)  # through the package: tests replace it there
    link = link_lines(lambda: tracking.experiment_link(out.experiment_id))  # the runs table: expand the parent run for its points
    best = []
    if with_best:
        from dvfs_mlops.mlops.sweep.best import sweep_best

        played = (lambda s: dev.setting(s.gpu_mhz, s.cpu_mhz, s.emc_mhz)) if choice.backend == "replay" else None
        best = sweep_best(tracking.client(), out.experiment_id, out.sweep_id, played)
    return SweepReport(out, bool(dev.simulated), link, best)


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
    return lambda features: governor.decide(features, board.frequencies_mhz)[0]
