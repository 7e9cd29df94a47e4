"""What a run logs, built in one place: a metered job's params, metrics, tags and power series (`RunRecord`).

A sweep point and `dvfs-mlops finetune` log a job through `job_record`, and `DvfsCallback` logs its session through
`callback_record`, so `energy_j` (the training steps only), `clock_mhz_measured`, `clock_held` and the flags mean the
same thing in every run. The callers add only what is theirs: a point its sweep's tags, a fine-tune its governor's.
Every name written is declared in `fields.py` (the features in `model.workload.WorkloadFeatures`): the workload's
features and the report's metrics are written from those declarations.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN, FreqRequest, freq_label
from dvfs_mlops.hw.board import Board
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.mlops import fields, schema

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.device import FreqSession
    from dvfs_mlops.hw.multi import GpuEnergy
    from dvfs_mlops.job.finetune import FinetuneResult
    from dvfs_mlops.job.refine import RefineResult
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.mlops.launch import Decision
    from dvfs_mlops.model.workload import WorkloadFeatures

POWER_SERIES_MAX_POINTS = 1000
# Backend observations (FreqSession.context) that are numbers: logged as metrics.
_CONTEXT_METRICS = ("gpu_temp_c", "gpu_temp_c_end", "nvpmodel_gpu_max_mhz", "gpu_temp_c_max", "cap_at_start_mhz",
                    "energy_counter_period_s", "clock_unheld_s")
# ... and text: logged as params (nvml: where the power samples come from, MIG mode and then the energy's scope; where
# energy_j comes from; the power mode's TPC mask; the clock limits NVML reported at the start).
_CONTEXT_PARAMS = ("nvpmodel_mode", "power_source", "mig_mode", "energy_scope", "energy_source", "nvpmodel_tpc_pg_mask",
                   "clock_limits_at_start")
# The callback logs into the user's own run: a few report metrics, prefixed (`dvfs_energy_j`, ...).
_CALLBACK_METRICS = ("energy_j", "energy_total_j", "avg_power_w", "peak_power_w", "time_s", "gpu_util_pct", "clock_mhz_measured",
                     "clock_held", "samples_failed", "emc_mhz", "oc_throttle_events")


@dataclasses.dataclass
class RunRecord:
    """Everything one run logs (`tracking.log_run_batch` writes it in as few requests as MLflow allows)."""

    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float | None] = dataclasses.field(default_factory=dict)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    series: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def plus(self, *, params: Mapping[str, Any] = {}, metrics: Mapping[str, float | None] = {},
             tags: Mapping[str, str] = {}) -> RunRecord:
        """This record with more params, metrics and tags (a caller's own)."""
        return RunRecord({**self.params, **params}, {**self.metrics, **metrics}, {**self.tags, **tags}, dict(self.series))

    def log(self, client: MlflowClient, run_id: str) -> None:
        """Write the record to run `run_id`."""
        from dvfs_mlops.mlops import tracking

        tracking.log_run_batch(client, run_id, params=self.params, metrics=self.metrics, tags=self.tags, series=self.series)


def report_metrics(report: EnergyReport) -> dict[str, float | None]:
    """The training window's energy, time, power, utilisation and the verified clock (`fields.REPORT_METRICS`; None
    values are not logged)."""
    out: dict[str, float | None] = {}
    for f in fields.REPORT_METRICS:
        value = getattr(report, f.report)
        out[f.name] = None if value is None else float(value)
    return out


def session_metrics(session: FreqSession) -> dict[str, float | None]:
    """Evaluation and whole-session energy beside the training window, and the backend's numeric observations."""
    out: dict[str, float | None] = {}
    evaluation = session.windows.get("eval")
    if evaluation is not None:
        out["eval_energy_j"] = evaluation.energy_j
        out["eval_time_s"] = evaluation.duration_s
    warmup = session.windows.get("warmup")
    if warmup is not None:  # the first steps, metered apart (FinetuneConfig.warmup_steps)
        out["warmup_energy_j"] = warmup.energy_j
        out["warmup_s"] = warmup.duration_s
    whole = session.session_report()
    out["session_energy_j"] = whole.energy_j
    out["session_time_s"] = whole.duration_s
    for key in _CONTEXT_METRICS:
        value = session.context.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def report_params(report: EnergyReport) -> dict[str, str]:
    """What the training window's figures mean: the rails summed into `energy_j` (`energy_rails`) and where the
    clock read back comes from (`clock_source`: measured or requested)."""
    params = {"energy_rails": ",".join(report.energy_rails)} if report.energy_rails else {}
    if report.clock_source:
        params["clock_source"] = report.clock_source
    return params


def session_tags(session: FreqSession, report: EnergyReport, board: Board) -> dict[str, str]:
    """Which board, and the flags a reader must see: clock held or not, observe mode, a degraded meter, above the
    nvpmodel mode's cap, a cap found at the start, the power mode (other than MAXN), a lost clock service, and a replay
    device's grid."""
    tags: dict[str, str] = {schema.TAG_DEVICE_ID: board.device_id}
    if report.clock_held is not None:
        tags[schema.TAG_CLOCK_HELD] = str(report.clock_held).lower()
    if session.observe:
        tags[schema.TAG_OBSERVE] = "true"
    if report.meter_degraded:
        tags[schema.TAG_METER_DEGRADED] = "true"
    if session.context.get("above_mode_cap"):
        tags[schema.TAG_ABOVE_MODE_CAP] = "true"
    cap = session.context.get("cap_at_start_mhz")
    if isinstance(cap, (int, float)) and not isinstance(cap, bool):
        tags[schema.TAG_CAP_AT_START] = f"{cap:g}"
    if board.power_mode_key:
        tags[schema.TAG_POWER_MODE] = board.power_mode_key
    if session.context.get("clock_lost"):
        tags[schema.TAG_CLOCK_LOST] = str(session.context["clock_lost"])[:5000]
    grid = getattr(session.device, "grid", None)
    if session.device.name == "replay" and grid is not None:
        tags.update({schema.TAG_DEVICE: "replay", schema.TAG_TRACE_SHA256: grid.sha256, schema.TAG_TRACE_NAME: grid.name})
    return tags


def clock_lost_line(session: FreqSession) -> str | None:
    """The one line that says a session's clock service lost its pin while it ran (context `clock_lost`, how long the
    clock was not held `clock_unheld_s`); None where it held throughout."""
    lost = session.context.get("clock_lost")
    if not lost:
        return None
    unheld = session.context.get("clock_unheld_s")
    how_long = f" for {unheld:g} s" if isinstance(unheld, (int, float)) else ""
    return (f"WARNING: the clock was not held{how_long}: {lost} (recorded on the run: tag {schema.TAG_CLOCK_LOST}, "
            "metric clock_unheld_s)")


def session_params(session: FreqSession) -> dict[str, str]:
    """The backend's text observations (nvpmodel mode) and, on hardware, the GPU's index."""
    device = session.device
    params = {k: str(session.context[k]) for k in _CONTEXT_PARAMS if k in session.context}
    if device.name in ("nvml", "jetson"):
        params["device_index"] = str(getattr(device, "index", 0))
    return params


def downsample(series: Sequence[float], n: int = POWER_SERIES_MAX_POINTS) -> list[float]:
    """At most `n` evenly spaced samples of a series (MLflow logs each as one metric step)."""
    if len(series) <= n:
        return list(series)
    step = len(series) / n
    return [series[int(i * step)] for i in range(n)]


def feature_params(features: WorkloadFeatures) -> dict[str, Any]:
    """The workload's features a run records as params (`fields.FEATURES`; lengths to 3 decimals)."""
    row = features.as_row()
    return {f.name: round(row[f.name], 3) if f.type is float else row[f.name] for f in fields.FEATURES}


def job_record(job: Job, board: Board, session: FreqSession, result: FinetuneResult, freq: FreqRequest, *,
               profiled: bool = False) -> RunRecord:
    """A metered job's run: the workload and its training (params), the training window and the session around it
    (metrics), which board and what the meter saw (tags), and the power series.

    Args:
        job: the `job.run.Job` that ran.
        board: the board it ran on.
        session: its `FreqSession`, exited.
        result: its `FinetuneResult`.
        freq: the clock it ran at (the settled one after refine) or "maxn".
        profiled: a profile-only job (the twin): `steps` is 0 and `profile_steps` the steps charged.

    Returns:
        The `RunRecord`.
    """
    cfg, report, task = job.config, session.report(), job.workload.task
    params = {
        **feature_params(job.workload.features), "model": job.workload.spec.name, "task": task.name, "freq_mhz": freq_label(freq),
        "device": board.backend, "device_profile": board.profile, "batch_size": cfg.batch_size,
        "steps": 0 if profiled else result.steps, "seed": cfg.seed, "split": task.split, "data_source": job.workload.data_source,
        "precision": cfg.precision, **cfg.peft.params(), **{k.name: getattr(cfg, k.name) for k in fields.KNOBS},
        **({"profile_steps": result.steps} if profiled else {}),
        "torch_device": job.torch_device, **session_params(session), **report_params(report),
    }
    return RunRecord(params, point_metrics(report, result, _clock_ran(session, freq), session),
                     session_tags(session, report, board), {"power_w": downsample(report.power_series_w)})


def _clock_ran(session: FreqSession, freq: FreqRequest) -> float | None:
    """The clock the job ran at: None when observing; the twin's own (maxn settles somewhere), else the pin."""
    if session.observe:
        return None
    return getattr(session, "effective_mhz", None) or (None if freq == MAXN else float(freq))


def point_metrics(report: EnergyReport, result: FinetuneResult, clock_mhz: float | None, session: FreqSession | None = None) -> dict[str, float | None]:
    """A job's metrics: the training window (energy_j, time_s, ...), the evaluation, throughput, the clock it ran at
    (`clock_mhz`), and the session around it."""
    t = report.duration_s
    samples = result.metered_samples  # the steps after warm-up, as energy_j and time_s
    return {
        **report_metrics(report), result.eval_metric: result.eval_value, **getattr(result, "extra_metrics", {}),
        "samples_per_s": samples / t if t > 0 else None, "energy_per_sample_j": report.energy_j / samples if samples else None,
        "wall_time_s": result.wall_time_s, "clock_mhz": clock_mhz,
        **(session_metrics(session) if session is not None else {}),
    }


def refine_tags(refined: RefineResult) -> dict[str, str]:
    """Probe-and-refine's tags (`refine.*`): where it started and settled, the probes, why, and the prior it used."""
    p = schema.REFINE_PREFIX
    return {f"{p}start_mhz": f"{refined.start_mhz:g}", f"{p}chosen_mhz": f"{refined.chosen_mhz:g}",
            f"{p}probes": ",".join(f"{q.freq_mhz:g}x{q.steps}" for q in refined.probes),
            f"{p}probe_steps": str(refined.probe_steps), f"{p}settle_steps": str(refined.settle_steps), f"{p}reason": refined.reason,
            f"{p}power_prior": refined.prior.to_json() if refined.prior is not None else "none"}


# Each GPU's own figures beside a several-GPU job's sums: <metric>/<host>/<uuid> (`gpu_metrics`).
_GPU_METRICS = ("energy_j", "energy_total_j", "avg_power_w", "clock_mhz_measured", "clock_held", "time_s")


def gpu_metrics(gpus: Sequence[GpuEnergy], prefix: str = "") -> dict[str, float | None]:
    """Each GPU's energy, power, time and clock as `<prefix><metric>/<host>/<uuid>` (`hw.multi.GpuEnergy.key`: keyed by
    node and GPU, never by the NVML index alone, which two nodes share)."""
    out: dict[str, float | None] = {}
    for gpu in gpus:
        reported = report_metrics(gpu.report)
        out.update({f"{prefix}{key}/{gpu.key}": reported[key] for key in _GPU_METRICS})
    return out


def gpu_tags(gpus: Sequence[GpuEnergy]) -> dict[str, str]:
    """How many GPUs and, per GPU (by `GpuEnergy.key`), its NVML index on its node and (under a launcher) the rank that
    trained on it."""
    tags = {schema.TAG_GPU_COUNT: str(len(gpus))}
    for gpu in gpus:
        tags[schema.TAG_GPU_INDEX.format(key=gpu.key)] = str(gpu.index)
        if gpu.rank is not None:
            tags[schema.TAG_GPU_RANK.format(key=gpu.key)] = str(gpu.rank)
    return tags


def callback_record(session: FreqSession, report: EnergyReport, board: Board, decision: Decision, precision: str,
                    refined: RefineResult | None = None, gpus: Sequence[GpuEnergy] = ()) -> RunRecord:
    """What `DvfsCallback` logs into the user's own MLflow run: prefixed report metrics, the decision and the board.

    With several GPUs (`gpus`: every rank's `hw.multi.GpuEnergy`, `report` their sum, `hw.multi.combine`) it adds each
    GPU's metrics (`dvfs_energy_j/<host>/<uuid>`, ...) and tags (how many, each one's index and rank); the warm-up is this
    process's GPU's."""
    reported = report_metrics(report)
    metrics: dict[str, float | None] = {f"dvfs_{key}": reported[key] for key in _CALLBACK_METRICS}
    warmup = session.windows.get("warmup")
    if warmup is not None:
        metrics.update({"dvfs_warmup_energy_j": warmup.energy_j, "dvfs_warmup_s": warmup.duration_s})
    tags = {**decision.tags(), schema.TAG_CALLBACK_FREQ: str(decision.freq_mhz), schema.TAG_SIMULATED: str(report.simulated).lower(),
            schema.TAG_CALLBACK_PRECISION: precision, schema.TAG_BOARD_FAMILY: board.family}
    if decision.features is not None:
        tags[schema.TAG_CALLBACK_TRAINABLE] = str(decision.features.trainable_params)
    tags.update(session_tags(session, report, board))
    if refined is not None:
        tags.update({**refine_tags(refined), schema.TAG_CALLBACK_FREQ: f"{refined.chosen_mhz:g}"})
    if len(gpus) > 1:
        metrics.update(gpu_metrics(gpus, "dvfs_"))
        tags.update(gpu_tags(gpus))
    return RunRecord(metrics=metrics, tags=tags)
