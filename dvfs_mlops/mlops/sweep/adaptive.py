"""`sweep --strategy adaptive`: per workload, only the clocks the curve model asks for.

MAXN first (the baseline, and the GPU utilisation the governor's features need), then the
production governor's clock for the workload (or the middle of the table when there is none),
then whatever `curve.next_clock` asks for until the optimum is pinned down (its fit leaning on the
power prior of the workloads measured before this one, once there are five): at most `MAX_PINNED`
pinned clocks. Each measured clock is an ordinary point run (every repeat), tagged
`dvfs.strategy=adaptive`; no unmeasured clock is ever logged as a run. The parent run gets
`predicted.csv`: every clock of every workload as the curve model predicts it, with a `measured`
column, the predicted optimum marked. Those predictions are made once every workload is measured, with
the board's power prior (power_prior.py: what the sweep's other workloads say about each one's power
curve, from their GPU utilisation) where at least five others have three clocks. Resume: points
already FINISHED are read back from the store, and the same choices are made again from them, so an
interrupted sweep continues where it stopped.
"""
from __future__ import annotations

import io
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.job.finetune import FinetuneResult
from dvfs_mlops.job.workloads.tasks import get_task
from dvfs_mlops.mlops import tracking
from dvfs_mlops.mlops.sweep.points import run_point
from dvfs_mlops.mlops.sweep.progress import Progress
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec
from dvfs_mlops.model.curve import Measurement, PowerPrior, fit_curve, next_clock, noise_for, voltage_shape_for
from dvfs_mlops.model.power_prior import MIN_CLOCKS, MIN_WORKLOADS, board_prior, leave_one_out_priors

MAX_PINNED = 4
TAG_STRATEGY = "dvfs.strategy"

StartClock = Callable[[Any], float | None]  # workload features (gpu_util_pct measured at maxn) -> the governor's clock


def _measurement(c: Any, exp_id: str, sweep_id: str, key: str | None = None) -> dict[str, dict[str, Any]]:
    """FINISHED point runs of the sweep (or the one point `key`) by point key: freq, time, energy, gpu util, run id."""
    where = f"tags.`{tracking.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'"
    if key is not None:
        where += f" and tags.`{tracking.TAG_POINT}` = '{key}'"
    out: dict[str, dict[str, Any]] = {}
    for r in c.search_runs([exp_id], filter_string=where, max_results=50000):
        k = r.data.tags.get(tracking.TAG_POINT)
        if k and "time_s" in r.data.metrics and "energy_j" in r.data.metrics:
            out[k] = {"time_s": r.data.metrics["time_s"], "energy_j": r.data.metrics["energy_j"], "run_id": r.info.run_id,
                      "gpu_util_pct": r.data.metrics.get("gpu_util_pct")}
    return out


def run_adaptive_sweep(spec: SweepSpec, device: Any, c: Any, exp_id: str, parent_id: str, created: bool, stale: dict[str, list[str]],
                       say: Callable[[str], None], where: str, start_clock: StartClock | None = None) -> tuple[list[str], list[str]]:
    """Measure each workload adaptively (parent run already made); returns (point keys run now, keys found finished)."""
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops.sweep.artifacts import log_sweep_artifacts

    table = sorted(float(f) for f in device.frequencies_mhz)
    known = _measurement(c, exp_id, spec.sweep_id)
    workloads = [(m, t) for m in spec.models for t in spec.tasks]
    sim_label = " (SIMULATED)" if device.simulated else ""
    say(f"sweep {spec.sweep_id} (adaptive): {len(workloads)} workloads, maxn + at most {MAX_PINNED} clocks each, "
        f"{len(known)} points already finished, on {device.name}{sim_label}; tracking {tracking.tracking_uri()}, experiment id {exp_id}")
    tracking.log_run_batch(c, parent_id, tags={tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_SIMULATED: str(device.simulated).lower(),
                                               "dvfs.device_profile": device.profile, TAG_STRATEGY: "adaptive"})
    progress = Progress(len(workloads) * (MAX_PINNED + 1) * spec.repeats, 0, say)
    ran: list[str] = []
    found: list[str] = []
    workload_points: list[tuple[str, list[Measurement]]] = []
    shape = voltage_shape_for(device)
    (noise_t, noise_p), per_mean = noise_for(device), spec.repeats ** 0.5
    noise = (noise_t / per_mean, noise_p / per_mean)  # a clock's measurement is the mean of its repeats
    completed = False
    try:
        for model, task in workloads:
            prepared = prepare_workload(task=task, **spec.entry(model).prepare_kwargs(), data_source=spec.data_source, data_dir=spec.data_dir, seed=spec.seed,
                                        train_size=spec.train_size, dev_size=spec.dev_size, peft=spec.peft, precision=spec.precision)
            trace_for = prepared.trace_provider(spec.batch_size, spec.trace_dtype) if device.simulated else None
            trained: dict[int, FinetuneResult] = {}

            def measure(freq: Any, model: str = model, task: str = task, prepared: Any = prepared, trace_for: Any = trace_for,
                        trained: dict[int, FinetuneResult] = trained) -> list[dict[str, Any]]:
                out = []
                for r in range(spec.repeats):
                    point = Point(model, task, freq, r, spec.variant)
                    if point.key in known:
                        found.append(point.key)
                    else:
                        for run_id in stale.pop(point.key, []):
                            c.set_terminated(run_id, "KILLED")
                        progress.start(point.key)
                        summary = run_point(c, exp_id, parent_id, spec, device, point, prepared, get_task(task).split, trace_for, trained,
                                            where)
                        ran.append(point.key)
                        progress.finish(point.key, summary)
                        known.update(_measurement(c, exp_id, spec.sweep_id, point.key))
                        c.set_tag(known[point.key]["run_id"], TAG_STRATEGY, "adaptive")
                    out.append(known[point.key])
                return out

            maxn = measure(MAXN)
            start = None
            if start_clock is not None:
                util = [m["gpu_util_pct"] for m in maxn if m.get("gpu_util_pct") is not None]
                feats = prepared.features.with_gpu_util(sum(util) / len(util)) if util else prepared.features
                start = start_clock(feats)
            start = table[len(table) // 2] if start is None else float(start)
            measured: list[Measurement] = []
            # the workloads measured so far say what they can about this one's power curve: with their prior the
            # stop rule is satisfied sooner (fewer clocks); the same prior on resume, as they are read back in order
            so_far = board_prior([m for _, m in workload_points], voltage_shape=shape, f_max_mhz=table[-1], noise=noise[1])
            while (f := next_clock(measured, table, start, max_clocks=MAX_PINNED, voltage_shape=shape, noise=noise,
                                   prior=so_far)) is not None:
                measured.append(_mean_measurement(f, measure(f)))
            workload_points.append((f"{model}/{task}{spec.variant}", measured))
        completed = True
    finally:
        progress.close()
        if completed:
            _log_predictions(c, parent_id, workload_points, table, shape, noise, device.simulated)
            log_sweep_artifacts(c, exp_id, parent_id, spec.sweep_id, device.simulated)
        if created:
            try:
                c.set_terminated(parent_id, "FINISHED" if completed else "KILLED")
            except Exception:
                if completed:
                    raise
    return ran, sorted(set(found))


def _mean_measurement(freq: float, rows: list[dict[str, Any]]) -> Measurement:
    """One clock's repeats as one measurement; its GPU utilisation only where every repeat has one."""
    utils = [float(r["gpu_util_pct"]) for r in rows if r.get("gpu_util_pct") is not None]
    util = sum(utils) / len(utils) / 100.0 if utils and len(utils) == len(rows) else None
    return Measurement(freq, sum(r["time_s"] for r in rows) / len(rows), sum(r["energy_j"] for r in rows) / len(rows), util)


def _predicted_rows(workload: str, measured: list[Measurement], table: list[float], shape: float, noise: tuple[float, float],
                    prior: PowerPrior | None) -> tuple[list[str], PowerPrior | None]:
    """predicted.csv's rows of one workload, and the prior its fit leaned on (None where a clock lacked utilisation)."""
    fit = fit_curve(measured, voltage_shape=shape, f_max_mhz=table[-1], noise=noise, prior=prior)
    pred = fit.predict(table)
    best = min(pred, key=lambda p: p.energy_j).freq_mhz
    have = {m.freq_mhz for m in measured}
    return [f"{workload},{p.freq_mhz:g},{p.time_s!r},{p.power_w!r},{p.energy_j!r},{'' if p.energy_std_j is None else repr(p.energy_std_j)},"
            f"{int(p.freq_mhz in have)},{int(p.freq_mhz == best)}" for p in pred], fit.prior


def _log_predictions(c: Any, parent_id: str, workloads: list[tuple[str, list[Measurement]]], table: list[float], shape: float,
                     noise: tuple[float, float], simulated: bool) -> None:
    """predicted.csv on the parent run: PREDICTIONS (the curve model), not measurements; `measured` says which clocks were run.
    Each workload's power curve leans on the board prior from the others where there is one (tag dvfs.power_prior)."""
    priors = leave_one_out_priors([m for _, m in workloads], voltage_shape=shape, f_max_mhz=table[-1], noise=noise[1])
    rows: list[str] = []
    with_prior: list[PowerPrior] = []
    for (name, measured), prior in zip(workloads, priors):
        more, used = _predicted_rows(name, measured, table, shape, noise, prior)
        rows += more
        with_prior += [used] if used is not None else []
    if with_prior:
        mean = sorted(p.log_ratio_mean for p in with_prior)[len(with_prior) // 2]
        spread = sorted(p.log_ratio_sd for p in with_prior)[len(with_prior) // 2]
        said = (f"{len(with_prior)} of {len(priors)} workloads, each from the others; idle share {with_prior[0].idle_share:g}, "
                f"log dynamic/static ratio {mean:.3f} +- {spread:.3f} (medians)")
    else:
        said = (f"none (it needs the GPU utilisation of at least {MIN_WORKLOADS + 1} workloads measured at {MIN_CLOCKS} or more "
                "clocks)")
    buf = io.StringIO()
    buf.write("workload,freq_mhz,predicted_time_s,predicted_power_w,predicted_energy_j,predicted_energy_std_j,measured,predicted_optimum\n")
    buf.write("\n".join(rows) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "predicted.csv"
        path.write_text(buf.getvalue())
        c.log_artifact(parent_id, str(path))
    tracking.log_run_batch(c, parent_id, tags={TAG_STRATEGY: "adaptive", "dvfs.predictions": "predicted.csv (curve model"
                                               + (", SIMULATED points" if simulated else "") + ")", "dvfs.power_prior": said})
