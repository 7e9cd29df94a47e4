"""The one sweep loop: every strategy's points run here, one MLflow run per point, resumable, shared by workers.

A strategy says which points to measure, round by round (`Strategy.rounds`): the grid asks for every point in one
round; the adaptive strategy asks for one clock of one workload at a time and reads back what was measured before
it asks for the next. The runner owns everything else, the same for both:
- the parent run (`lifecycle.owned_run`: named `sweep <id>` however it was started; under `mlflow run` it is MLflow's
  run), tagged with the sweep, the board (`board.json`), the definition (`sweep_definition`) and its process; it ends
  FINISHED once the sweep is complete, KILLED when stopped (Ctrl-C, SIGTERM, SIGHUP: also after the last point), FAILED
  with the reason otherwise;
- resume: FINISHED points are not run again, RUNNING ones a dead worker left are closed as KILLED and redone, and so
  are the parent runs of this sweep whose process died on this machine;
- claims: workers given the same sweep claim each point before running it (claims.py; through the tracking server
  itself, the claim is the point's run, and each worker starts at its own place in a round), a point another live
  worker holds is waited for (and taken over once its lease expires), a point found FINISHED is never run twice;
- a tracking store that fails under a claimed point (a server restarting): the clocks are restored, the point is
  released and tried again after 5, 10, 15 s; a fourth failure in a row, a refused request, or any failure without
  claims ends the sweep (the same command resumes it);
- on hardware, `settle_s` of idling before each point after the first;
- once complete: the strategy's own artifacts (predicted.csv) and the sweep's plots and summary.csv.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from dvfs_mlops.errors import TrackingStoreError
from dvfs_mlops.hw.board import ARTIFACT as BOARD_ARTIFACT
from dvfs_mlops.hw.board import Board, board_of
from dvfs_mlops.mlops import lifecycle, schema, tracking
from dvfs_mlops.mlops.claims import (
    DEFAULT_TTL_S,
    Claim,
    ClaimTarget,
    Lease,
    PointClaims,
    TrackingClaims,
    claim_scope,
    default_worker,
    open_claims,
    this_process,
)
from dvfs_mlops.mlops.sweep.artifacts import log_sweep_artifacts
from dvfs_mlops.mlops.sweep.points import PointContext, run_point, tracked
from dvfs_mlops.mlops.sweep.progress import Progress
from dvfs_mlops.mlops.sweep.replayed import run_replayed_point
from dvfs_mlops.mlops.sweep.resume import check_same_profile, close_stale_parents, finished_points, point_runs
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.job.workloads.prepare import PreparedWorkload
    from dvfs_mlops.mlops.sweep.replayed import ReplayedWorkload

log = logging.getLogger(__name__)

STORE_FAILURES_PER_POINT = 3
STORE_BACKOFF_S = 5.0


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How this worker runs a sweep (none of it is the sweep's identity).

    Attributes:
        announce: where progress lines go (default: the log).
        settle_s: on hardware, seconds to idle before each point after the first (cool-down).
        start_clock: the adaptive strategy's first clock for a workload's features (the governor's), else mid-table.
        claims: where workers claim points (default: beside the tracking store, `claims.open_claims`).
        claim_ttl_s: a claim's lease; a dead worker's points are taken over after it.
        worker: this worker's name in the claims (default: host, pid and board).
        wait_poll_s: how often to look at points other workers hold (default from 0.5 s up to ttl/4).
        adopt_run: the parent is the run `mlflow run` started for the command ($MLFLOW_RUN_ID) where there is one;
            False for a command that runs several sweeps (calibrate), each with its own parent.
        parent_tags: more tags of the parent run (a calibration's sweeps: `dvfs.sweep_kind`).
    """

    announce: Callable[[str], None] | None = None
    settle_s: float = 0.0
    start_clock: Callable[[Any], float | None] | None = None
    claims: PointClaims | None = None
    claim_ttl_s: float = DEFAULT_TTL_S
    worker: str = ""
    wait_poll_s: float | None = None
    adopt_run: bool = True
    parent_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SweepOutcome:
    """What one worker's run of a sweep did."""

    sweep_id: str
    parent_run_id: str
    ran: list[str]
    skipped: list[str]
    experiment_id: str
    by_others: list[str] = dataclasses.field(default_factory=list)  # finished by other workers while this one ran
    experiment: str = ""  # the experiment's name (under `mlflow run`: the one MLflow chose)


class Strategy(Protocol):
    """Which points a sweep measures, round by round."""

    def expected_points(self) -> int:
        """How many points the sweep will have at most (for progress)."""
        ...

    def counted(self, done: set[str]) -> int:
        """How many of `done` (FINISHED point keys of the sweep id) are this strategy's points (for progress)."""
        ...

    def describe(self, runner: SweepRunner) -> str:
        """The sweep's one-line start announcement."""
        ...

    def rounds(self, runner: SweepRunner) -> Iterator[list[Point]]:
        """Yield lists of points; each is measured (by this worker or another) before the next is asked for."""
        ...

    def finish(self, runner: SweepRunner) -> None:
        """The strategy's own artifacts, once the sweep is complete."""
        ...


class SweepRunner:
    """One worker's run of one sweep: the parent run, claims, leases, retries, progress and artifacts."""

    def __init__(self, spec: SweepSpec, device: Device, board: Board, options: RunOptions):
        self.spec, self.device, self.board, self.options = spec, device, board, options
        self.say = options.announce or log.info
        self.client = c = tracking.check_reachable()  # before any clock is touched
        if (exp := c.get_experiment_by_name(spec.experiment)) is not None:  # before a parent run is made for it
            check_same_profile(c, [exp.experiment_id], spec.sweep_id, board.profile)
        self.claims = options.claims if options.claims is not None else open_claims(None, tracking.tracking_uri())
        self.worker = options.worker or default_worker(board.device_id)
        self.experiment_id, self.parent_id = "", ""  # the parent run's, once `run` opened it
        self.done: set[str] = set()
        self.stale: dict[str, list[str]] = {}
        self.scope = ""
        self.points: PointContext | None = None
        self.ran: list[str] = []
        self.found: list[str] = []  # asked for and already FINISHED when this worker got to them
        self.others: list[str] = []  # finished by another worker while this one ran
        self._workloads: dict[str, Any] = {}
        self._store_failures: dict[str, int] = {}
        self._failures_in_a_row = 0
        self.progress: Progress | None = None
        self._rng = random.Random()  # its own, from the OS: a job that seeds `random` would give every worker one order

    # the parent run ---------------------------------------------------------------------------------
    def _bind(self, parent: lifecycle.OwnedRun) -> None:
        """The parent run is open: what the store has of the sweep (finished points, runs dead workers left), and the
        claims bound to it."""
        c, spec = self.client, self.spec
        self.experiment_id, self.parent_id = parent.experiment_id, parent.run_id
        if parent.adopted and parent.experiment_name != spec.experiment:
            log.warning("note: the sweep logs into experiment %r (the one `mlflow run` chose); pass --experiment-name %s to "
                        "`mlflow run` to use %r", parent.experiment_name, spec.experiment, spec.experiment)
        self.claims.bind(ClaimTarget(c, self.experiment_id, spec.sweep_id, self.parent_id))
        self.done, self.stale = finished_points(c, [self.experiment_id], spec.sweep_id)
        self.scope = claim_scope(spec.sweep_id, self.experiment_id, tracking.tracking_uri())
        self.points = PointContext(c, self.experiment_id, self.parent_id, spec, self.device, self.board)
        closed = close_stale_parents(c, [self.experiment_id], spec.sweep_id, self.parent_id)
        if closed:
            self.say(f"sweep {spec.sweep_id}: {len(closed)} parent run(s) of a process that is gone closed as KILLED")

    def log_parent(self) -> None:
        """The parent's tags, the definition and the board record: the same for every strategy, however it started."""
        spec, board = self.spec, self.board
        tags = {schema.TAG_SWEEP: spec.sweep_id, schema.TAG_SIMULATED: str(board.simulated).lower(),
                schema.TAG_DEVICE_PROFILE: board.profile, schema.TAG_DEVICE_ID: board.device_id,
                schema.TAG_BOARD_FAMILY: board.family, schema.TAG_RUN_NAME: f"sweep {spec.sweep_id}"}
        if spec.strategy != "grid":
            tags[schema.TAG_STRATEGY] = spec.strategy
        params = {"sweep_definition": json.dumps(spec.definition())[:6000]}
        with contextlib.suppress(Exception):  # a resumed sweep's own parent may hold it already (the same value)
            existing = self.client.get_run(self.parent_id).data.params
            if "sweep_definition" in existing:
                params = {}
        tracking.log_run_batch(self.client, self.parent_id, params=params, tags=tags)
        tracking.log_text_artifact(self.client, self.parent_id, BOARD_ARTIFACT, board.to_json())

    # points -----------------------------------------------------------------------------------------
    def workload(self, point: Point) -> PreparedWorkload | ReplayedWorkload:
        """The point's prepared workload (prepared once per workload; a failure frees the point's claim at once)."""
        if point.workload not in self._workloads and self.spec.replayed:  # a measured grid's: nothing to prepare
            from dvfs_mlops.mlops.sweep.replayed import replayed_workload

            self._workloads[point.workload] = replayed_workload(cast("ReplayDevice", self.device).grid, point.workload)
        if point.workload not in self._workloads:
            from dvfs_mlops.job.workloads.prepare import prepare_workload

            spec = self.spec
            try:
                self._workloads[point.workload] = prepare_workload(
                    task=point.task, **spec.entry(point.model).prepare_kwargs(), data_source=spec.data_source,
                    data_dir=spec.data_dir, seed=spec.seed, train_size=spec.train_size, dev_size=spec.dev_size, peft=spec.peft,
                    precision=spec.precision)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.claims.release(self.scope, point.key, self.worker, done=False)
                raise
        return self._workloads[point.workload]

    def run_round(self, points: list[Point]) -> None:
        """Measure every point of the round: run the free ones, then wait for those other workers hold."""
        todo = []
        for p in points:
            if p.key in self.done:
                if p.key not in self.ran and p.key not in self.others and p.key not in self.found:
                    self.found.append(p.key)
            else:
                todo.append(p)
        if self.claims.kind == "tracking" and todo:
            # workers that start together would all claim the same first point, find each other and back off, point after
            # point: each starts at its own place in the round (kept in order, so a workload's points stay together)
            at = self._rng.randrange(len(todo))
            todo = todo[at:] + todo[:at]
        held = [p for p in todo if not self._attempt(p)]
        if held:
            self.say(f"sweep {self.spec.sweep_id}: waiting for {len(held)} point(s) other workers hold (taken over if a claim expires)")
        # most held points finish within seconds (another worker runs them now): ask soon, then less and less often
        poll_s, poll_max = ((self.options.wait_poll_s, self.options.wait_poll_s) if self.options.wait_poll_s is not None
                            else (0.5, max(0.5, min(10.0, self.options.claim_ttl_s / 4))))
        while held:
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, poll_max)
            held = [p for p in held if not self._attempt(p)]

    def _attempt(self, point: Point) -> bool:
        """Claim and run `point` when it is free; False while a live worker holds it, or after the tracking store failed
        under a claimed point (a restarting server): the claim is released and the point tried again a few times."""
        try:
            answered = self._claim_and_run(point)
        except TrackingStoreError as e:
            self._failures_in_a_row += 1
            failures = self._store_failures[point.key] = self._store_failures.get(point.key, 0) + 1
            if self.claims.kind == "none" or not e.transient or max(self._failures_in_a_row, failures) > STORE_FAILURES_PER_POINT:
                raise
            self.say(f"{point.key}: the tracking store failed ({e.cause}); clocks restored, point released, "
                     f"trying it again in {STORE_BACKOFF_S * self._failures_in_a_row:.0f} s")
            time.sleep(STORE_BACKOFF_S * self._failures_in_a_row)
            return False
        if answered:  # the store answered for this point (a held one asked it nothing)
            self._failures_in_a_row = 0
        return answered

    def _claim_and_run(self, point: Point) -> bool:
        c, spec = self.client, self.spec
        got = self.claims.claim(self.scope, point.key, self.worker, self.options.claim_ttl_s)
        if got is Claim.DONE and not tracked(lambda: point_runs(c, self.experiment_id, spec.sweep_id, point.key)[0], point):
            log.warning("%s is marked done in the claims but has no FINISHED run (deleted?): measuring it again", point.key)
            self.claims.forget(self.scope, point.key)
            got = self.claims.claim(self.scope, point.key, self.worker, self.options.claim_ttl_s)
        if got is Claim.TAKEN:
            return self._run_claimed(point)
        if got is Claim.DONE:
            self._by_other(point)
        return got is not Claim.HELD

    def _by_other(self, point: Point) -> None:
        self.others.append(point.key)
        self.done.add(point.key)

    def _run_claimed(self, point: Point) -> bool:
        """Run a point this worker claimed; False when another worker took it over meanwhile (it is waited for, as a
        held point, until that worker's run is FINISHED)."""
        c, spec = self.client, self.spec
        lease = Lease(self.claims, self.scope, point.key, self.worker, self.options.claim_ttl_s)  # beats while the workload loads
        try:
            workload = self.workload(point)
            if self.claims.kind == "none":
                old_runs = self.stale.pop(point.key, [])
            elif self.claims.kind == "tracking":  # the claim read the point's runs: none FINISHED, stale ones closed
                old_runs = []
            else:  # what the store has now: the point may have been finished, or left RUNNING by a worker that died
                finished, old_runs = tracked(lambda: point_runs(c, self.experiment_id, spec.sweep_id, point.key), point)
                if finished:
                    lease.stop()
                    self.claims.release(self.scope, point.key, self.worker, done=True)
                    self._by_other(point)
                    return True
            assert self.progress is not None
            self.progress.start(point.key)
            for run_id in old_runs:
                tracked(lambda run_id=run_id: lifecycle.end_stale(c, run_id, "left RUNNING by a worker that is gone"), point)  # type: ignore[misc]
            if self.ran and self.options.settle_s > 0 and not self.board.simulated:
                time.sleep(self.options.settle_s)
            assert self.points is not None
            run: Callable[..., str | None] = run_replayed_point if spec.replayed else run_point
            summary = run(self.points, point, workload, still_mine=lease.still_mine if self.claims.kind != "none" else None,
                                run_id=self.claims.run_of(self.scope, point.key))
        except BaseException:
            lease.stop()
            with contextlib.suppress(Exception):  # free it at once for another worker (else it frees when it expires)
                self.claims.release(self.scope, point.key, self.worker, done=False)
            raise
        lease.stop()
        if summary is None:  # taken over while it ran (this worker was cut off for a whole TTL): the other run counts
            self.say(f"{point.key}: another worker took this point over; its run counts, this one is KILLED")
            return False
        self.claims.release(self.scope, point.key, self.worker, done=True)
        self.ran.append(point.key)
        self.done.add(point.key)
        self.progress.finish(point.key, summary)
        return True

    # the whole sweep --------------------------------------------------------------------------------
    def run(self, strategy: Strategy) -> SweepOutcome:
        """Open the parent run, log it, measure every round the strategy asks for, then the artifacts of a complete
        sweep; the parent ends FINISHED only then (`lifecycle.owned_run`)."""
        spec = self.spec
        tags = {schema.TAG_SWEEP: spec.sweep_id, schema.TAG_PROCESS: json.dumps(this_process()), **self.options.parent_tags}
        with lifecycle.owned_run(spec.experiment, name=f"sweep {spec.sweep_id}", tags=tags, client=self.client,
                                 adopt=self.options.adopt_run) as parent:
            self._bind(parent)
            self.log_parent()
            self.say(strategy.describe(self))
            self.progress = Progress(strategy.expected_points(), strategy.counted(self.done), self.say)
            try:
                for points in strategy.rounds(self):
                    self.run_round(points)
            finally:
                self._close_workers()
            strategy.finish(self)  # an interrupted sweep gets its artifacts on resume
            log_sweep_artifacts(self.client, self.experiment_id, self.parent_id, spec.sweep_id, self.board.simulated,
                                replayed=spec.replayed)
        return SweepOutcome(spec.sweep_id, self.parent_id, self.ran, sorted(self.found), self.experiment_id, sorted(self.others),
                            parent.experiment_name)

    def _close_workers(self) -> None:
        """The progress bar and the claims, however the rounds ended; the tracking claims' cost said."""
        assert self.progress is not None
        self.progress.close()
        self.claims.close()
        if isinstance(self.claims, TrackingClaims):
            stats = self.claims.stats
            self.say(f"sweep {self.spec.sweep_id}: claims through the tracking server: {stats.backoffs} back-off(s) "
                     f"({stats.backoff_s:.2f} s), {stats.takeovers} stale claim(s) taken over")


def run_sweep(spec: SweepSpec, device: Device, board: Board | None = None, options: RunOptions | None = None) -> SweepOutcome:
    """Run (or resume) a sweep on this worker.

    Args:
        spec: the sweep's definition (`build_spec`).
        device: the open device whose clocks the points pin.
        board: its `Board` (default: resolved from the device, training on the backend's own torch device).
        options: how this worker runs it (`RunOptions`).

    Returns:
        The `SweepOutcome`: the points this worker ran, those it found finished, those other workers finished.

    Raises:
        DvfsError: the tracking store is unreachable, the sweep id belongs to another device profile, CUDA is missing
            for a GPU backend (all before any clock is touched), or a point failed (the clocks are restored).
    """
    from dvfs_mlops.mlops.sweep.adaptive import AdaptiveStrategy
    from dvfs_mlops.mlops.sweep.grid import GridStrategy

    board = board or board_of(device)
    options = options or RunOptions()
    runner = SweepRunner(spec, device, board, options)
    strategy = AdaptiveStrategy(spec, options.start_clock) if spec.strategy == "adaptive" else GridStrategy(spec)
    return runner.run(strategy)
