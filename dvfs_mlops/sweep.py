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
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dvfs_mlops import records, tracking
from dvfs_mlops.device.base import MAXN, FreqRequest, freq_label, parse_freq
from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.finetune import FinetuneConfig, FinetuneResult, finetune
from dvfs_mlops.meter import EnergyReport
from dvfs_mlops.workloads.tasks import TASKS, get_task
from dvfs_mlops.workloads.zoo import PRESETS as MODEL_PRESETS

POWER_SERIES_MAX_POINTS = 1000


@dataclasses.dataclass(frozen=True)
class SweepPreset:
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    freqs: tuple[str, ...] | None  # None = the device's whole table
    steps: int
    profile_steps: int = 100
    train_size: int = 2048
    dev_size: int = 256
    repeats: int = 1


PRESETS: dict[str, SweepPreset] = {
    # 2 tiny models x 3 tasks (2 train, 1 eval) x 3 clocks + maxn, a few steps: under a minute on a CPU.
    "smoke": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), ("510", "816", "1300.5"), steps=4, train_size=128, dev_size=64),
    # The smallest BERT and Pythia on sst2, mrpc, rte at every clock + maxn: minutes on 2 cores.
    "quick": SweepPreset(("bert-tiny", "pythia-14m"), ("sst2", "mrpc", "rte"), None, steps=60),
    # The study: 12 models x 9 tasks. On the twin, steps=0 profiles without training.
    "paper": SweepPreset(tuple(MODEL_PRESETS), tuple(TASKS), None, steps=0, profile_steps=200),
}


@dataclasses.dataclass(frozen=True)
class Point:
    model: str
    task: str
    freq: FreqRequest
    repeat: int

    @property
    def workload(self) -> str:
        return f"{self.model}/{self.task}"

    @property
    def key(self) -> str:
        return f"{self.workload}@{freq_label(self.freq)}#{self.repeat}"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    freqs: tuple[FreqRequest, ...]
    steps: int
    profile_steps: int
    batch_size: int
    repeats: int
    seed: int
    data_source: str
    data_dir: str | None
    train_size: int
    dev_size: int
    experiment: str
    replay: bool
    device_profile: str
    sweep_id: str = ""
    shuffle_clocks: bool = False  # on hardware: a seeded random clock order per workload and repeat

    def points(self) -> list[Point]:
        out = []
        for m in self.models:
            for t in self.tasks:
                for r in range(self.repeats):
                    freqs = list(self.freqs)
                    if self.shuffle_clocks:
                        random.Random(f"{self.seed}|{m}/{t}|{r}").shuffle(freqs)
                    out += [Point(m, t, f, r) for f in freqs]
        return out

    def definition(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("sweep_id")
        d.pop("experiment")
        d.pop("shuffle_clocks")  # the order of the points, not what is measured
        d["freqs"] = [freq_label(f) for f in self.freqs]
        return d

    def with_default_id(self) -> SweepSpec:
        if self.sweep_id:
            return self
        digest = hashlib.sha256(json.dumps(self.definition(), sort_keys=True).encode()).hexdigest()[:10]
        return dataclasses.replace(self, sweep_id=f"sweep-{digest}")


def _split_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [s.strip() for s in items if s.strip()]


def build_spec(device: Any, preset: str = "quick", *, models: Any = None, tasks: Any = None, freqs: Any = None,
               steps: int | None = None, profile_steps: int | None = None, batch_size: int = 16, repeats: int | None = None,
               seed: int = 0, data_source: str = "synthetic", data_dir: str | None = None, experiment: str = "dvfs-sweep",
               replay: bool = True, sweep_id: str | None = None, train_size: int | None = None, dev_size: int | None = None) -> SweepSpec:
    """Preset + overrides -> a validated SweepSpec (every name checked before anything runs)."""
    if preset not in PRESETS:
        raise unknown("preset", preset, list(PRESETS))
    p = PRESETS[preset]
    model_list = _split_list(models) or list(p.models)
    for m in model_list:
        if m not in MODEL_PRESETS:
            raise unknown("model", m, list(MODEL_PRESETS))
    task_list = _split_list(tasks) or list(p.tasks)
    for t in task_list:
        get_task(t)
    freq_names = _split_list(freqs) or (list(p.freqs) if p.freqs else None)
    table = device.frequencies_mhz
    if freq_names is None:
        freq_list: list[FreqRequest] = [MAXN, *table]
    else:
        parsed = [parse_freq(f, table) for f in freq_names]
        freq_list = ([MAXN] if MAXN not in parsed else []) + parsed  # maxn always: the baseline
        freq_list = sorted(set(freq_list), key=lambda f: -1.0 if f == MAXN else float(f))
    n_steps = p.steps if steps is None else steps
    if n_steps < 0:
        raise DvfsError(f"--steps must be >= 0, got {n_steps}")
    if n_steps == 0 and not device.simulated:
        raise DvfsError("--steps 0 (profile only) exists only on the sim device: real hardware has to train to be measured")
    if data_dir is not None:
        data_source = "tsv"
        from dvfs_mlops.workloads.glue_tsv import check_task_dir

        for t in task_list:
            check_task_dir(Path(data_dir), get_task(t))
    spec = SweepSpec(
        models=tuple(model_list), tasks=tuple(task_list), freqs=tuple(freq_list), steps=n_steps,
        profile_steps=p.profile_steps if profile_steps is None else profile_steps, batch_size=batch_size,
        repeats=p.repeats if repeats is None else repeats, seed=seed, data_source=data_source, data_dir=data_dir,
        train_size=p.train_size if train_size is None else train_size, dev_size=p.dev_size if dev_size is None else dev_size,
        experiment=experiment, replay=replay and device.simulated, device_profile=device.profile, sweep_id=sweep_id or "",
        shuffle_clocks=not device.simulated,
    )
    return spec.with_default_id()


@dataclasses.dataclass
class SweepOutcome:
    sweep_id: str
    parent_run_id: str
    ran: list[str]
    skipped: list[str]
    experiment_id: str


class _Progress:
    """tqdm on a terminal; one line per point otherwise (logs, CI)."""

    def __init__(self, total: int, done: int):
        self.total, self.done = total, done
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, unit="point", dynamic_ncols=True)

    def start(self, key: str) -> None:
        if self._bar is not None:
            self._bar.set_description(key)

    def finish(self, key: str, summary: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(summary)
        else:
            print(f"[{self.done}/{self.total}] {key}: {summary}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _finished_points(c: Any, experiment_ids: list[str], sweep_id: str) -> tuple[set[str], dict[str, list[str]]]:
    """FINISHED point keys, and run ids of unfinished runs per key (to mark as killed and redo)."""
    runs = c.search_runs(experiment_ids, filter_string=f"tags.`{tracking.TAG_SWEEP}` = '{sweep_id}'", max_results=50000)
    done: set[str] = set()
    stale: dict[str, list[str]] = {}
    for r in runs:
        key = r.data.tags.get(tracking.TAG_POINT)
        if not key:
            continue
        if r.info.status == "FINISHED":
            done.add(key)
        elif r.info.status in ("RUNNING", "SCHEDULED"):
            stale.setdefault(key, []).append(r.info.run_id)
    return done, stale


def _resolve_parent(c: Any, spec: SweepSpec) -> tuple[str, str, bool]:
    """(experiment id, parent run id, created by us). Under `mlflow run`, the parent is MLFLOW_RUN_ID."""
    env_run = os.environ.get("MLFLOW_RUN_ID")
    if env_run:
        try:
            run = c.get_run(env_run)
        except Exception as e:  # noqa: BLE001
            raise DvfsError(f"MLFLOW_RUN_ID={env_run} does not exist in {tracking.tracking_uri()}: {e}") from None
        exp_id = run.info.experiment_id
        exp_name = c.get_experiment(exp_id).name
        if exp_name != spec.experiment:
            print(f"note: the sweep logs into experiment {exp_name!r} (the one `mlflow run` chose); "
                  f"pass --experiment-name {spec.experiment} to `mlflow run` to use {spec.experiment!r}", file=sys.stderr)
        return exp_id, env_run, False
    exp_id = tracking.experiment_id(c, spec.experiment)
    run = c.create_run(exp_id, run_name=f"sweep {spec.sweep_id}", tags={tracking.TAG_SWEEP: spec.sweep_id})
    return exp_id, run.info.run_id, True


def _point_params(spec: SweepSpec, point: Point, features: Any, device: Any, split: str) -> dict[str, Any]:
    return {
        "model": point.model, "model_type": features.model_type, "num_layers": features.num_layers,
        "hidden_size": features.hidden_size, "num_params": features.num_params, "task": point.task,
        "avg_seq_len": round(features.avg_seq_len, 3), "freq_mhz": freq_label(point.freq), "device": device.name,
        "device_profile": device.profile, "batch_size": spec.batch_size, "steps": spec.steps, "seed": spec.seed,
        "repeat": point.repeat, "split": split, "data_source": spec.data_source,
        **({"profile_steps": spec.profile_steps} if spec.steps == 0 else {}),
    }


def point_metrics(report: EnergyReport, result: FinetuneResult, effective_mhz: float | None,
                  session: Any = None) -> dict[str, float | None]:
    """A point's metrics: the training window (energy_j, time_s, ...), eval apart, the verified clock."""
    t = report.duration_s
    samples = result.train_samples
    return {
        **records.report_metrics(report), result.eval_metric: result.eval_value,
        "samples_per_s": samples / t if t > 0 else None, "energy_per_sample_j": report.energy_j / samples if samples else None,
        "wall_time_s": result.wall_time_s, "clock_mhz": effective_mhz,
        **(records.session_metrics(session) if session is not None else {}),
    }


def _downsample(series: Sequence[float], n: int = POWER_SERIES_MAX_POINTS) -> list[float]:
    if len(series) <= n:
        return list(series)
    step = len(series) / n
    return [series[int(i * step)] for i in range(n)]


def run_sweep(spec: SweepSpec, device: Any, announce: Callable[[str], None] | None = None, *,
              torch_device: str | None = None, settle_s: float = 0.0) -> SweepOutcome:
    """Run (or resume) a sweep; returns what ran and what was already there.

    `torch_device`: where training runs (default: the backend's own, `device.torch_device`);
    `settle_s`: seconds to idle before each point after the first, on hardware (cool-down).
    """
    from dvfs_mlops.device.placement import resolve_torch_device
    from dvfs_mlops.workloads.prepare import prepare_workload

    say = announce or (lambda m: print(m, file=sys.stderr))
    where = resolve_torch_device(device, torch_device)  # CUDA missing: an error before any clock is touched
    c = tracking.check_reachable()  # before any clock is touched
    exp_id, parent_id, created = _resolve_parent(c, spec)
    done, stale = _finished_points(c, [exp_id], spec.sweep_id)
    points = spec.points()
    todo = [p for p in points if p.key not in done]
    sim_label = " (SIMULATED)" if device.simulated else ""
    say(f"sweep {spec.sweep_id}: {len(points)} points, {len(points) - len(todo)} already finished, {len(todo)} to run "
        f"on {device.name}{sim_label}; tracking {tracking.tracking_uri()}, experiment id {exp_id}")
    tracking.log_run_batch(c, parent_id, params={"sweep_definition": json.dumps(spec.definition())[:6000]} if created else {},
                           tags={tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_SIMULATED: str(device.simulated).lower(),
                                 "dvfs.device_profile": device.profile})
    progress = _Progress(len(points), len(points) - len(todo))
    ran: list[str] = []
    completed = False
    try:
        by_workload: dict[str, list[Point]] = {}
        for p in todo:
            by_workload.setdefault(p.workload, []).append(p)
        for workload, wpoints in by_workload.items():
            model, task = workload.split("/")
            prepared = prepare_workload(model, task, data_source=spec.data_source, data_dir=spec.data_dir, seed=spec.seed,
                                        train_size=spec.train_size, dev_size=spec.dev_size)
            split = TASKS[task].split
            trace_for = prepared.trace_provider(spec.batch_size) if device.simulated else None
            trained: dict[int, FinetuneResult] = {}  # repeat -> the run whose numerics are replayed
            for point in wpoints:
                progress.start(point.key)
                for run_id in stale.pop(point.key, []):
                    c.set_terminated(run_id, "KILLED")
                if ran and settle_s > 0 and not device.simulated:
                    time.sleep(settle_s)
                summary = _run_point(c, exp_id, parent_id, spec, device, point, prepared, split, trace_for, trained, where)
                ran.append(point.key)
                progress.finish(point.key, summary)
        completed = True
    finally:
        progress.close()
        if completed:  # plots and CSV describe a complete sweep; an interrupted one gets them on resume
            _log_sweep_artifacts(c, exp_id, parent_id, spec.sweep_id, device.simulated)
        if created:
            try:
                c.set_terminated(parent_id, "FINISHED" if completed else "KILLED")
            except Exception:
                if completed:
                    raise
    return SweepOutcome(spec.sweep_id, parent_id, ran, sorted(done), exp_id)


def _run_point(c: Any, exp_id: str, parent_id: str, spec: SweepSpec, device: Any, point: Point, prepared: Any,
               split: str, trace_for: Any, trained: dict[int, FinetuneResult], torch_device: str = "cpu") -> str:
    cfg = FinetuneConfig(steps=spec.steps if spec.steps > 0 else spec.profile_steps, batch_size=spec.batch_size, seed=spec.seed)
    profile_only = spec.steps == 0
    replay = spec.replay and not profile_only and point.repeat in trained
    tags = {
        tracking.TAG_PARENT: parent_id, tracking.TAG_SWEEP: spec.sweep_id, tracking.TAG_POINT: point.key,
        tracking.TAG_WORKLOAD: point.workload, tracking.TAG_SIMULATED: str(device.simulated).lower(),
        tracking.TAG_REPLAY: str(replay).lower(), tracking.TAG_PROFILE_ONLY: str(profile_only).lower(),
    }
    run = _tracked(lambda: c.create_run(exp_id, run_name=point.key, tags=tags), point)
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
            else:
                result = finetune(prepared.model_config, prepared.train, prepared.dev, prepared.encoder.pad_id, cfg,
                                  is_regression=prepared.data.task.is_regression, session=session, trace_for=trace_for,
                                  run_training=not profile_only, torch_device=torch_device)
                result.model = None
                if spec.replay:
                    trained[point.repeat] = result
        report = session.report()
        effective = getattr(session, "effective_mhz", None) or (None if point.freq == MAXN else float(point.freq))
        metrics = point_metrics(report, result, effective, session)
        params = {**_point_params(spec, point, prepared.features, device, split), **records.session_params(session),
                  "torch_device": torch_device}
        _tracked(lambda: tracking.log_run_batch(c, run_id, params=params, metrics=metrics, tags=records.session_tags(session, report),
                                                series={"power_w": _downsample(report.power_series_w)}), point)
        _tracked(lambda: c.set_terminated(run_id, "FINISHED"), point)
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


def _tracked(call: Callable[[], Any], point: Point) -> Any:
    """An MLflow call of a point; a store that fails (after MLflow's bounded retries) is one clear error."""
    from mlflow.exceptions import MlflowException

    try:
        return call()
    except (MlflowException, OSError) as e:  # requests' errors are OSErrors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DvfsError(f"the tracking store {tracking.tracking_uri()} failed while logging {point.key} ({first}); "
                        "that point is not recorded and the clocks are restored; re-run the same sweep to resume") from None


def sweep_frame(c: Any, experiment_ids: list[str], sweep_id: str) -> Any:
    """All FINISHED point runs of a sweep as a pandas DataFrame (one row per run)."""
    import mlflow

    df = mlflow.search_runs(experiment_ids, filter_string=f"tags.`{tracking.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'",
                            max_results=50000)
    if len(df) and f"tags.{tracking.TAG_POINT}" in df:
        df = df[df[f"tags.{tracking.TAG_POINT}"].notna()]
    return df


def _log_sweep_artifacts(c: Any, exp_id: str, parent_id: str, sweep_id: str, simulated: bool) -> None:
    from dvfs_mlops.plots import plot_workload_curves

    df = sweep_frame(c, [exp_id], sweep_id)
    if not len(df):
        return
    with tempfile.TemporaryDirectory() as tmp:
        cols = [k for k in df.columns if k.startswith(("params.", "metrics.", "tags.dvfs"))] + ["run_id", "status"]
        summary = df[cols].rename(columns=lambda k: k.split(".", 1)[1] if k.startswith(("params.", "metrics.")) else k)
        summary = summary.sort_values(["model", "task", "repeat", "freq_mhz"], key=lambda s: s.map(_sort_key))
        summary.to_csv(Path(tmp) / "summary.csv", index=False)
        c.log_artifact(parent_id, str(Path(tmp) / "summary.csv"))
        plots = Path(tmp) / "plots"
        plots.mkdir()
        plot_workload_curves(summary, plots, simulated)
        c.log_artifacts(parent_id, str(plots), artifact_path="plots")


def _sort_key(v: Any) -> Any:
    if v == MAXN:
        return -1.0
    try:
        return float(v)
    except (TypeError, ValueError):
        return v
