"""What a run logs, built in one place: a metered job's params, metrics, tags and power series (`RunRecord`).

A sweep point and `dvfs-mlops finetune` log a job through `job_record`, and `DvfsCallback` logs its session through
`callback_record`, so `energy_j` (the training steps only), `clock_mhz_measured`, `clock_held` and the flags mean the
same thing in every run. The callers add only what is theirs: a point its sweep's tags, a fine-tune its governor's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dvfs_mlops.clocks import MAXN, FreqRequest, freq_label
from dvfs_mlops.hw.board import Board
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.mlops import schema

POWER_SERIES_MAX_POINTS = 1000
# Backend observations (FreqSession.context) that are numbers: logged as metrics.
_CONTEXT_METRICS = ("gpu_temp_c", "gpu_temp_c_end", "nvpmodel_gpu_max_mhz", "gpu_temp_c_max")
# ... and text: logged as params (nvml: where the power samples come from, MIG mode and then the energy's scope).
_CONTEXT_PARAMS = ("nvpmodel_mode", "power_source", "mig_mode", "energy_scope")
# The callback logs into the user's own run: a few report metrics, prefixed (`dvfs_energy_j`, ...).
_CALLBACK_METRICS = {"energy_j": "dvfs_energy_j", "energy_total_j": "dvfs_energy_total_j", "avg_power_w": "dvfs_avg_power_w",
                     "peak_power_w": "dvfs_peak_power_w", "time_s": "dvfs_time_s", "gpu_util_pct": "dvfs_gpu_util_pct",
                     "clock_mhz_measured": "dvfs_clock_mhz_measured", "clock_held": "dvfs_clock_held",
                     "samples_failed": "dvfs_samples_failed", "emc_mhz": "dvfs_emc_mhz",
                     "oc_throttle_events": "dvfs_oc_throttle_events"}


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

    def log(self, client: Any, run_id: str) -> None:
        """Write the record to run `run_id`."""
        from dvfs_mlops.mlops import tracking

        tracking.log_run_batch(client, run_id, params=self.params, metrics=self.metrics, tags=self.tags, series=self.series)


def report_metrics(report: EnergyReport) -> dict[str, float | None]:
    """The training window's energy, time, power, utilisation and the verified clock (None values are not logged)."""
    return {
        "energy_j": report.energy_j, "energy_gpu_j": report.energy_gpu_j, "energy_cpu_j": report.energy_cpu_j,
        "energy_total_j": report.energy_total_j, "avg_power_w": report.avg_power_w, "peak_power_w": report.peak_power_w,
        "time_s": report.duration_s, "gpu_util_pct": report.gpu_util_pct, "clock_mhz_measured": report.clock_mhz_measured,
        "clock_held": None if report.clock_held is None else float(report.clock_held),
        "samples_failed": float(report.samples_failed),
        # the window's mean memory clock and the over-current throttling the board counted in it (Jetson; else None)
        "emc_mhz": report.emc_mhz,
        "oc_throttle_events": None if report.oc_throttle_events is None else float(report.oc_throttle_events),
        # the twin's noise-free values (None, so not logged, on real backends)
        "energy_expected_j": report.energy_expected_j, "time_expected_s": report.time_expected_s,
    }


def session_metrics(session: Any) -> dict[str, float | None]:
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


def session_tags(session: Any, report: EnergyReport, board: Board) -> dict[str, str]:
    """Which board, and the flags a reader must see: clock held or not, observe mode, a degraded meter, above the
    nvpmodel mode's cap."""
    tags: dict[str, str] = {schema.TAG_DEVICE_ID: board.device_id}
    if report.clock_held is not None:
        tags[schema.TAG_CLOCK_HELD] = str(report.clock_held).lower()
    if session.observe:
        tags[schema.TAG_OBSERVE] = "true"
    if report.meter_degraded:
        tags[schema.TAG_METER_DEGRADED] = "true"
    if session.context.get("above_mode_cap"):
        tags[schema.TAG_ABOVE_MODE_CAP] = "true"
    return tags


def session_params(session: Any) -> dict[str, str]:
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


def job_record(job: Any, board: Board, session: Any, result: Any, freq: FreqRequest, *, profiled: bool = False) -> RunRecord:
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
    f, cfg, report = job.workload.features, job.config, session.report()
    task = job.workload.task
    params = {
        "model": job.workload.spec.name, "model_type": f.model_type, "num_layers": f.num_layers, "hidden_size": f.hidden_size,
        "num_params": f.num_params, "task": task.name, "avg_seq_len": round(f.avg_seq_len, 3), "freq_mhz": freq_label(freq),
        "device": board.backend, "device_profile": board.profile, "batch_size": cfg.batch_size,
        "steps": 0 if profiled else result.steps, "seed": cfg.seed, "split": task.split, "data_source": job.workload.data_source,
        "precision": cfg.precision, "trainable_params": f.trainable_params, **cfg.peft.params(),
        **({"profile_steps": result.steps} if profiled else {}), "torch_device": job.torch_device, **session_params(session), **report_params(report),
    }
    return RunRecord(params, point_metrics(report, result, _clock_ran(session, freq), session),
                     session_tags(session, report, board), {"power_w": downsample(report.power_series_w)})


def _clock_ran(session: Any, freq: FreqRequest) -> float | None:
    """The clock the job ran at: None when observing; the twin's own (maxn settles somewhere), else the pin."""
    if session.observe:
        return None
    return getattr(session, "effective_mhz", None) or (None if freq == MAXN else float(freq))


def point_metrics(report: EnergyReport, result: Any, clock_mhz: float | None, session: Any = None) -> dict[str, float | None]:
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


def refine_tags(refined: Any) -> dict[str, str]:
    """Probe-and-refine's tags (`refine.*`): where it started and settled, the probes, why, and the prior it used."""
    p = schema.REFINE_PREFIX
    return {f"{p}start_mhz": f"{refined.start_mhz:g}", f"{p}chosen_mhz": f"{refined.chosen_mhz:g}",
            f"{p}probes": ",".join(f"{q.freq_mhz:g}x{q.steps}" for q in refined.probes),
            f"{p}probe_steps": str(refined.probe_steps), f"{p}settle_steps": str(refined.settle_steps), f"{p}reason": refined.reason,
            f"{p}power_prior": refined.prior.to_json() if refined.prior is not None else "none"}


# Each GPU's own figures beside a several-GPU job's sums: <metric>_gpu<NVML index> (`gpu_metrics`).
_GPU_METRICS = ("energy_j", "energy_total_j", "avg_power_w", "clock_mhz_measured", "clock_held", "time_s")


def gpu_metrics(gpus: Sequence[Any], prefix: str = "") -> dict[str, float | None]:
    """Each GPU's energy, power, time and clock as `<prefix><metric>_gpu<NVML index>` (`hw.multi.GpuEnergy` items)."""
    out: dict[str, float | None] = {}
    for gpu in gpus:
        reported = report_metrics(gpu.report)
        out.update({f"{prefix}{key}_gpu{gpu.index}": reported[key] for key in _GPU_METRICS})
    return out


def gpu_tags(gpus: Sequence[Any]) -> dict[str, str]:
    """How many GPUs, each one's UUID and (under a launcher) the rank that trained on it."""
    tags = {schema.TAG_GPU_COUNT: str(len(gpus))}
    for gpu in gpus:
        tags[schema.TAG_GPU_UUID.format(index=gpu.index)] = gpu.uuid
        if gpu.rank is not None:
            tags[schema.TAG_GPU_RANK.format(index=gpu.index)] = str(gpu.rank)
    return tags


def callback_record(session: Any, report: EnergyReport, board: Board, decision: Mapping[str, Any], features: Any,
                    precision: str, refined: Any = None, gpus: Sequence[Any] = ()) -> RunRecord:
    """What `DvfsCallback` logs into the user's own MLflow run: prefixed report metrics, the decision and the board.

    With several GPUs (`gpus`: every rank's `hw.multi.GpuEnergy`, `report` their sum, `hw.multi.combine`) it adds each
    GPU's metrics (`dvfs_energy_j_gpu<i>`, ...) and tags (how many, each one's UUID and rank); the warm-up is this
    process's GPU's."""
    reported = report_metrics(report)
    metrics: dict[str, float | None] = {name: reported[key] for key, name in _CALLBACK_METRICS.items()}
    warmup = session.windows.get("warmup")
    if warmup is not None:
        metrics.update({"dvfs_warmup_energy_j": warmup.energy_j, "dvfs_warmup_s": warmup.duration_s})
    g = decision.get("governor", {})
    tags = {schema.TAG_CALLBACK_FREQ: str(decision.get("freq")), schema.TAG_DECISION_PATH: str(decision.get("path")),
            schema.TAG_GOVERNOR_URI: str(g.get("uri")), schema.TAG_GOVERNOR_VERSION: str(g.get("version") or ""),
            schema.TAG_SIMULATED: str(report.simulated).lower(), schema.TAG_CALLBACK_PRECISION: precision,
            schema.TAG_BOARD_FAMILY: board.family, **decision.get("tags", {})}
    if features is not None:
        tags[schema.TAG_CALLBACK_TRAINABLE] = str(features.trainable_params)
    tags.update(session_tags(session, report, board))
    if refined is not None:
        tags.update({**refine_tags(refined), schema.TAG_CALLBACK_FREQ: f"{refined.chosen_mhz:g}"})
    if len(gpus) > 1:
        metrics.update(gpu_metrics(gpus, "dvfs_"))
        tags.update(gpu_tags(gpus))
    return RunRecord(metrics=metrics, tags=tags)
