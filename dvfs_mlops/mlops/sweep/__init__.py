"""Sweep orchestration: every workload x clock x repeat as one nested MLflow run, resumable.

A sweep is identified by `dvfs.sweep_id` (a hash of its definition unless given), so re-running
the same sweep skips points that already have a FINISHED run and re-does RUNNING/FAILED ones.
On hardware the clock order is shuffled per workload and repeat (seeded by the sweep's seed), so
drift (warming up, a thermal soak) does not line up with the clock; `settle_s` waits between
points.
On the twin, numerics don't depend on the clock: each workload is trained once and its step
trace replayed at the other clocks (tag `dvfs.sim_replay=true`); `steps=0` only plans and charges
the steps (no training, no eval metrics, tag `dvfs.profile_only=true`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from dvfs_mlops.errors import TrackingStoreError
from dvfs_mlops.job.finetune import FinetuneResult
from dvfs_mlops.job.workloads.tasks import get_task
from dvfs_mlops.mlops import tracking
from dvfs_mlops.mlops.claims import DEFAULT_TTL_S, Claim, Lease, PointClaims, claim_scope, default_worker, open_claims
from dvfs_mlops.mlops.queries import sweep_frame
from dvfs_mlops.mlops.records import point_metrics
from dvfs_mlops.mlops.sweep.artifacts import log_sweep_artifacts
from dvfs_mlops.mlops.sweep.points import POWER_SERIES_MAX_POINTS, run_point, tracked
from dvfs_mlops.mlops.sweep.progress import Progress
from dvfs_mlops.mlops.sweep.resume import check_same_profile, finished_points, point_runs, resolve_parent
from dvfs_mlops.mlops.sweep.spec import MODEL_PRESETS, PRESETS, Point, SweepPreset, SweepSpec, build_spec, check_names

log = logging.getLogger(__name__)

# A claimed point whose tracking store does not answer (a server restarting, a cut connection) is released and tried
# again after 5, 10, 15 s: a fleet worker rides out a restart instead of dying. A fourth failure in a row (whatever the
# point) ends the sweep, as does a store that refused a request, and any failure without claims (the re-run resumes).
STORE_FAILURES_PER_POINT = 3
STORE_BACKOFF_S = 5.0


@dataclasses.dataclass
class SweepOutcome:
    sweep_id: str
    parent_run_id: str
    ran: list[str]
    skipped: list[str]
    experiment_id: str
    by_others: list[str] = dataclasses.field(default_factory=list)  # finished by other workers while this one ran


def run_sweep(spec: SweepSpec, device: Any, announce: Callable[[str], None] | None = None, *,
              torch_device: str | None = None, settle_s: float = 0.0, start_clock: Callable[[Any], float | None] | None = None,
              claims: PointClaims | None = None, claim_ttl_s: float = DEFAULT_TTL_S, worker: str = "",
              wait_poll_s: float | None = None) -> SweepOutcome:
    """Run (or resume) a sweep; returns what ran and what was already there.

    `torch_device`: where training runs (default: the backend's own, `device.torch_device`);
    `settle_s`: seconds to idle before each point after the first, on hardware (cool-down).
    `start_clock`: with `spec.strategy == "adaptive"`, the governor's clock for a workload's features
    (where the adaptive search starts; None: the middle of the table).
    `claims`: where workers given the same sweep claim points (claims.py; default: beside the tracking store). A point
    a live worker holds is skipped, then waited for at the end (polling every `wait_poll_s`, default from 0.5 s up to ttl/4) and taken
    over when its claim expires, so each worker's command ends with the whole sweep done.
    """
    from dvfs_mlops.hw.placement import resolve_torch_device
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    say = announce or log.info
    where = resolve_torch_device(device, torch_device)  # CUDA missing: an error before any clock is touched
    c = tracking.check_reachable()  # before any clock is touched
    if (exp := c.get_experiment_by_name(spec.experiment)) is not None:  # before a parent run is made for it
        check_same_profile(c, [exp.experiment_id], spec.sweep_id, device.profile)
    board = str(getattr(device, "device_id", "") or "")
    claims = claims if claims is not None else open_claims(None, tracking.tracking_uri())
    worker = worker or default_worker(board)
    exp_id, parent_id, created = resolve_parent(c, spec)
    done, stale = finished_points(c, [exp_id], spec.sweep_id)
    if spec.strategy == "adaptive":
        from dvfs_mlops.mlops.sweep.adaptive import run_adaptive_sweep

        if claims.kind != "none":
            log.info("adaptive sweeps do not claim points: give each worker its own workloads")
        claims.close()
        ran_now, found = run_adaptive_sweep(spec, device, c, exp_id, parent_id, created, stale, say, where, start_clock)
        return SweepOutcome(spec.sweep_id, parent_id, ran_now, found, exp_id)
    points = spec.points()
    todo = [p for p in points if p.key not in done]
    scope = claim_scope(spec.sweep_id, exp_id, tracking.tracking_uri())
    sim_label = " (SIMULATED)" if device.simulated else ""
    say(f"sweep {spec.sweep_id}: {len(points)} points, {len(points) - len(todo)} already finished, {len(todo)} to run "
        f"on {device.name}{sim_label} {board}; tracking {tracking.tracking_uri()}, experiment id {exp_id}"
        + (f"; points claimed in {claims.kind}" if claims.kind != "none" else ""))
    tracking.log_run_batch(c, parent_id, params={"sweep_definition": json.dumps(spec.definition())[:6000]} if created else {},
                           tags={tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_SIMULATED: str(device.simulated).lower(),
                                 "dvfs.device_profile": device.profile, tracking.TAG_DEVICE_ID: board})
    progress = Progress(len(points), len(points) - len(todo), say)
    ran: list[str] = []
    others: list[str] = []  # points another worker finished while this one ran
    completed = False
    prepared_for: dict[str, Any] = {}
    trained_for: dict[str, dict[int, FinetuneResult]] = {}  # workload -> repeat -> the run whose numerics are replayed

    def run_claimed(point: Point) -> None:
        model, task = point.model, point.task
        if point.workload not in prepared_for:
            try:
                prepared = prepare_workload(task=task, **spec.entry(model).prepare_kwargs(), data_source=spec.data_source,
                                            data_dir=spec.data_dir, seed=spec.seed, train_size=spec.train_size,
                                            dev_size=spec.dev_size, peft=spec.peft, precision=spec.precision)
                trace_for = prepared.trace_provider(spec.batch_size, spec.trace_dtype) if device.simulated else None
            except BaseException:
                with contextlib.suppress(Exception):  # free the point for another worker at once
                    claims.release(scope, point.key, worker, done=False)
                raise
            prepared_for[point.workload] = (prepared, trace_for)
        prepared, trace_for = prepared_for[point.workload]
        lease = Lease(claims, scope, point.key, worker, claim_ttl_s)
        try:
            if claims.kind == "none":
                old_runs = stale.pop(point.key, [])
            else:  # what the store has now: the point may have been finished, or left RUNNING by a worker that died
                finished, old = tracked(lambda: point_runs(c, exp_id, spec.sweep_id, point.key), point)
                if finished:
                    lease.stop()
                    claims.release(scope, point.key, worker, done=True)
                    others.append(point.key)
                    return
                old_runs = old
            progress.start(point.key)
            for run_id in old_runs:
                tracked(lambda run_id=run_id: c.set_terminated(run_id, "KILLED"), point)
            if ran and settle_s > 0 and not device.simulated:
                time.sleep(settle_s)
            summary = run_point(c, exp_id, parent_id, spec, device, point, prepared, get_task(task).split, trace_for,
                                trained_for.setdefault(point.workload, {}), where,
                                still_mine=lease.still_mine if claims.kind != "none" else None)
        except BaseException:
            lease.stop()
            with contextlib.suppress(Exception):  # free it at once for another worker (else it frees when it expires)
                claims.release(scope, point.key, worker, done=False)
            raise
        lease.stop()
        if summary is None:  # taken over while it ran (this worker was cut off for a whole TTL): the other run counts
            others.append(point.key)
            say(f"{point.key}: another worker took this point over; its run counts, this one is KILLED")
            return
        claims.release(scope, point.key, worker, done=True)
        ran.append(point.key)
        progress.finish(point.key, summary)

    store_failures: dict[str, int] = {}  # point key -> tracking-store failures
    store_failures_in_a_row = 0  # over all points: a store that stays down ends the sweep after a few, not N x a few

    def attempt(point: Point) -> bool:
        """Claim and run `point` when it is free; False while a live worker holds it, or after the tracking store failed
        under a claimed point (a restarting server): the claim is released and the point tried again a few times."""
        nonlocal store_failures_in_a_row
        try:
            answered = claim_and_run(point)
        except TrackingStoreError as e:
            store_failures_in_a_row += 1
            failures = store_failures[point.key] = store_failures.get(point.key, 0) + 1
            if claims.kind == "none" or not e.transient or max(store_failures_in_a_row, failures) > STORE_FAILURES_PER_POINT:
                raise
            say(f"{point.key}: the tracking store failed ({e.cause}); clocks restored, point released, "
                f"trying it again in {STORE_BACKOFF_S * store_failures_in_a_row:.0f} s")
            time.sleep(STORE_BACKOFF_S * store_failures_in_a_row)
            return False
        if answered:  # the store answered for this point (a held one asked it nothing)
            store_failures_in_a_row = 0
        return answered

    def claim_and_run(point: Point) -> bool:
        got = claims.claim(scope, point.key, worker, claim_ttl_s)
        if got is Claim.DONE and not tracked(lambda: point_runs(c, exp_id, spec.sweep_id, point.key)[0], point):
            log.warning("%s is marked done in the claims but has no FINISHED run (deleted?): measuring it again", point.key)
            claims.forget(scope, point.key)
            got = claims.claim(scope, point.key, worker, claim_ttl_s)
        if got is Claim.TAKEN:
            run_claimed(point)
        elif got is Claim.DONE:
            others.append(point.key)
        return got is not Claim.HELD

    try:
        held = [point for point in todo if not attempt(point)]
        if held:
            say(f"sweep {spec.sweep_id}: waiting for {len(held)} point(s) other workers hold (taken over if a claim expires)")
        # most held points finish within seconds (another worker runs them now): ask soon, then less and less often
        poll, poll_max = (wait_poll_s, wait_poll_s) if wait_poll_s is not None else (0.5, max(0.5, min(10.0, claim_ttl_s / 4)))
        while held:
            time.sleep(poll)
            poll = min(poll * 1.5, poll_max)
            held = [point for point in held if not attempt(point)]
        completed = True
    finally:
        progress.close()
        claims.close()
        if completed:  # plots and CSV describe a complete sweep; an interrupted one gets them on resume
            log_sweep_artifacts(c, exp_id, parent_id, spec.sweep_id, device.simulated)
        if created:
            try:
                c.set_terminated(parent_id, "FINISHED" if completed else "KILLED")
            except Exception:
                if completed:
                    raise
    return SweepOutcome(spec.sweep_id, parent_id, ran, sorted(done), exp_id, sorted(others))


__all__ = ["MODEL_PRESETS", "POWER_SERIES_MAX_POINTS", "PRESETS", "Point", "SweepOutcome", "SweepPreset", "SweepSpec", "build_spec", "check_names",
           "point_metrics", "run_sweep", "sweep_frame"]
