"""One sweep point: a metered session (trained, replayed or profiled), logged as one MLflow run."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dvfs_mlops.clocks import MAXN, freq_label
from dvfs_mlops.errors import TrackingStoreError
from dvfs_mlops.job.finetune import FinetuneConfig, FinetuneResult, finetune, profile_only
from dvfs_mlops.mlops import records, tracking
from dvfs_mlops.mlops.records import point_metrics
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec

POWER_SERIES_MAX_POINTS = 1000


def _point_params(spec: SweepSpec, point: Point, features: Any, device: Any, split: str) -> dict[str, Any]:
    entry = spec.entry(point.model)  # where a non-preset's config came from: what `twin fit` rebuilds the point from
    source = {"model_config": entry.config_path} if entry.config_path else {"pretrained": entry.pretrained} if entry.pretrained else {}
    return {
        **source,
        "model": point.model, "model_type": features.model_type, "num_layers": features.num_layers,
        "hidden_size": features.hidden_size, "num_params": features.num_params, "task": point.task,
        "avg_seq_len": round(features.avg_seq_len, 3), "freq_mhz": freq_label(point.freq), "device": device.name,
        "device_profile": device.profile, "batch_size": spec.batch_size, "steps": spec.steps, "seed": spec.seed,
        "repeat": point.repeat, "split": split, "data_source": spec.data_source, "precision": spec.precision,
        "trainable_params": features.trainable_params, **spec.peft.params(),
        **({"profile_steps": spec.profile_steps} if spec.steps == 0 else {}),
    }


def _downsample(series: Sequence[float], n: int = POWER_SERIES_MAX_POINTS) -> list[float]:
    if len(series) <= n:
        return list(series)
    step = len(series) / n
    return [series[int(i * step)] for i in range(n)]


def run_point(c: Any, exp_id: str, parent_id: str, spec: SweepSpec, device: Any, point: Point, prepared: Any,
               split: str, trace_for: Any, trained: dict[int, FinetuneResult], torch_device: str = "cpu",
               still_mine: Callable[[], bool] | None = None) -> str | None:
    """Run and log one point. `still_mine` (a claimed point) is asked right before the run is marked FINISHED: when
    another worker took the point over meanwhile, this run ends KILLED (tag dvfs.claim_lost) and None is returned."""
    cfg = FinetuneConfig(steps=spec.steps if spec.steps > 0 else spec.profile_steps, batch_size=spec.batch_size, seed=spec.seed,
                         precision=spec.precision, peft=spec.peft)
    profiling = spec.steps == 0
    replay = spec.replay and not profiling and point.repeat in trained
    tags = {
        tracking.TAG_PARENT: parent_id, tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_POINT: point.key,
        tracking.TAG_WORKLOAD: point.workload, tracking.TAG_SIMULATED: str(device.simulated).lower(),
        tracking.TAG_REPLAY: str(replay).lower(), tracking.TAG_PROFILE_ONLY: str(profiling).lower(),
    }
    run = tracked(lambda: c.create_run(exp_id, run_name=point.key, tags=tags), point)
    run_id = run.info.run_id
    try:
        noise = {"noise_key": f"{point.workload}#{point.repeat}"} if device.simulated else {}
        session = device.session(point.freq, **noise)
        with session:
            if replay:
                source = trained[point.repeat]
                with session.window("train"):
                    for n in source.padded_lengths:
                        session.step(trace_for(n))
                result = dataclasses.replace(source, model=None, wall_time_s=0.0)
            elif profiling:  # from the cached token lengths: no data, tokenizer, model config or torch
                result = profile_only(prepared.train_lengths, cfg, prepared.task.metric, session=session, trace_for=trace_for,
                                      torch_device=torch_device)
            else:
                result = finetune(prepared.model_config, prepared.train, prepared.dev, prepared.encoder.pad_id, cfg,
                                  is_regression=prepared.data.task.is_regression, session=session, trace_for=trace_for,
                                  torch_device=torch_device, task_kind=prepared.task.kind)
                result.model = None
                if spec.replay:
                    trained[point.repeat] = result
        report = session.report()
        effective = getattr(session, "effective_mhz", None) or (None if point.freq == MAXN else float(point.freq))
        metrics = point_metrics(report, result, effective, session)
        params = {**_point_params(spec, point, prepared.features, device, split), **records.session_params(session),
                  "torch_device": torch_device}
        tracked(lambda: tracking.log_run_batch(c, run_id, params=params, metrics=metrics, tags=records.session_tags(session, report),
                                                series={"power_w": _downsample(report.power_series_w)}), point)
        if still_mine is not None and not still_mine():
            tracked(lambda: c.set_tag(run_id, tracking.TAG_CLAIM_LOST, "true"), point)
            tracked(lambda: c.set_terminated(run_id, "KILLED"), point)
            return None
        tracked(lambda: c.set_terminated(run_id, "FINISHED"), point)
    except BaseException:
        status = "KILLED" if isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit)) else "FAILED"
        with contextlib.suppress(Exception):  # the store itself may be what failed; the resume redoes the point
            c.set_terminated(run_id, status)
        raise
    acc = metrics.get(result.eval_metric)
    label = "SIMULATED " if device.simulated else ""
    held = " (clock did NOT hold)" if report.clock_held is False else ""
    return (f"{report.energy_j:.1f} J {label}in {report.duration_s:.2f} s" + (f", {result.eval_metric[5:]} {acc:.3f}" if acc is not None else "")
            + held)


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
