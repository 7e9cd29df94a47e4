"""One sweep point: a metered job (trained, replayed on the twin, or profiled), logged as one MLflow run."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import TrackingStoreError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.job.finetune import FinetuneConfig, FinetuneResult
from dvfs_mlops.job.run import PROFILE, REPLAY, TRAIN, Job
from dvfs_mlops.mlops import lifecycle, records, schema, tracking
from dvfs_mlops.mlops.launch import Decision, Launch
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.device import Device, FreqSession
    from dvfs_mlops.job.workloads.prepare import PreparedWorkload
    from dvfs_mlops.mlops.lifecycle import OwnedRun
    from dvfs_mlops.mlops.records import RunRecord


@dataclasses.dataclass
class PointContext:
    """What every point of one sweep on one worker shares: the store, the parent run, the spec, the device and board,
    and, on the twin, each workload's trained run whose numerics the other clocks replay (by repeat)."""

    client: MlflowClient
    experiment_id: str
    parent_id: str
    spec: SweepSpec
    device: Device
    board: Board
    trained: dict[str, dict[int, FinetuneResult]] = dataclasses.field(default_factory=dict)

    def job(self, workload: PreparedWorkload) -> Job:
        """A point's job: the prepared workload trained as the spec says (profile-only points charge `profile_steps`)."""
        s = self.spec
        cfg = FinetuneConfig(steps=s.steps if s.steps > 0 else s.profile_steps, batch_size=s.batch_size, seed=s.seed,
                             precision=s.precision, peft=s.peft, warmup_steps=s.warmup_steps, **dict(s.knobs))
        return Job(workload, cfg, self.board.torch_device)


def run_point(ctx: PointContext, point: Point, workload: PreparedWorkload, still_mine: Callable[[], bool] | None = None,
              run_id: str | None = None) -> str | None:
    """Run and log one point (`launch.Launch` at the point's clock, its run `lifecycle.owned_run`); returns its one-line
    summary.

    `run_id`: the point's run made already (a claim through the tracking server is the point's run); else one is
    created here.

    `still_mine` (a claimed point) is asked right before the run is marked FINISHED: when another worker took the point
    over meanwhile, this run ends KILLED (tag dvfs.claim_lost) and None is returned.

    Raises:
        TrackingStoreError: the store failed (after MLflow's bounded retries); the run is left FAILED, clocks restored.
    """
    spec, c = ctx.spec, ctx.client
    trained = ctx.trained.setdefault(point.workload, {})
    mode = PROFILE if spec.steps == 0 else REPLAY if spec.train_once and point.repeat in trained else TRAIN
    tags = {schema.TAG_SWEEP: spec.sweep_id, schema.TAG_POINT: point.key,
            schema.TAG_WORKLOAD: point.workload, schema.TAG_SIMULATED: str(ctx.board.simulated).lower(),
            schema.TAG_TRAIN_ONCE: str(mode == REPLAY).lower(), schema.TAG_PROFILE_ONLY: str(mode == PROFILE).lower(),
            **({schema.TAG_STRATEGY: spec.strategy} if spec.strategy != "grid" else {})}
    job = ctx.job(workload)
    with contextlib.ExitStack() as stack:
        run = tracked(lambda: stack.enter_context(lifecycle.owned_run(
            spec.experiment, experiment_id=ctx.experiment_id, name=point.key, tags=tags, parent_id=ctx.parent_id, run_id=run_id,
            client=c)), point)
        launch = Launch(ctx.device, ctx.board, Decision.at(point.freq, f"sweep point {point.key}", cpu_mhz=point.cpu_mhz,
                                                           emc_mhz=point.emc_mhz),
                        label=f"{point.workload}#{point.repeat}")
        done = launch.run(job, mode=mode, replay_of=trained.get(point.repeat))
        result = done.result
        assert result is not None
        if mode == TRAIN:
            result.model = None
            if spec.train_once:
                trained[point.repeat] = result
        # where a non-preset's config came from (what `twin fit` rebuilds the point from), and the sweep's data source
        # as the definition names it (tsv for a folder, whatever its files)
        entry = spec.entry(point.model)
        source = {"model_config": entry.config_path} if entry.config_path else {"pretrained": entry.pretrained} if entry.pretrained else {}
        joint_metrics, joint_params = joint_energy(done.session) if spec.joint else ({}, {})
        record = records.job_record(job, ctx.board, done.session, result, point.freq, profiled=mode == PROFILE).plus(
            params={**source, "model": point.model, "repeat": point.repeat, "data_source": spec.data_source, **point.params(),
                    **joint_params}, metrics=joint_metrics)
        if not log_and_end(run, c, record, point, still_mine):
            return None
    report = done.report
    acc = record.metrics.get(result.eval_metric)
    label = "SIMULATED " if ctx.board.simulated else ""
    held = " (clock did NOT hold)" if report.clock_held is False else ""
    return (f"{report.energy_j:.1f} J {label}in {report.duration_s:.2f} s" + (f", {result.eval_metric[5:]} {acc:.3f}" if acc is not None else "")
            + held)


def joint_energy(session: FreqSession | None) -> tuple[dict[str, float | None], dict[str, str]]:
    """A joint sweep's point on the twin: the training window's energy on the rails a joint comparison uses
    (`SimSession.joint`: the CPU and memory clocks' rails included), as (metrics, params); nothing elsewhere."""
    reading = getattr(session, "joint", None)
    if reading is None:
        return {}, {}
    r = reading()
    return ({"energy_joint_j": r.energy_joint_j, "energy_joint_expected_j": r.energy_joint_expected_j},
            {"energy_joint_rails": ",".join(r.rails)})


def log_and_end(run: OwnedRun, c: MlflowClient, record: RunRecord, point: Point, still_mine: Callable[[], bool] | None) -> bool:
    """Log a point's record and end its run: FINISHED, or KILLED and tagged claim-lost where another worker took the
    point over meanwhile (`still_mine` says no). Returns whether the point was still this worker's."""
    tracked(lambda: run.log(record), point)
    if still_mine is not None and not still_mine():
        tracked(lambda: c.set_tag(run.run_id, schema.TAG_CLAIM_LOST, "true"), point)
        tracked(lambda: run.end(lifecycle.KILLED, "another worker took the point over"), point)
        return False
    tracked(lambda: run.end(lifecycle.FINISHED), point)
    return True


def tracked(call: Callable[[], Any], point: Point) -> Any:
    """An MLflow call of a point; a store that fails (after MLflow's bounded retries) is one clear error."""
    from mlflow.exceptions import MlflowException

    try:
        return call()
    except (MlflowException, OSError) as e:  # requests' errors are OSErrors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise TrackingStoreError(f"the tracking store {tracking.tracking_uri()} failed while logging {point.key} ({first}); "
                                 "that point is not recorded and the clocks are restored; re-run the same sweep to resume",
                                 cause=first, transient=tracking.is_store_outage(e)) from None
