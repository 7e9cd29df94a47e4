"""What one metered session logs to MLflow: metrics, tags and params, the same for every command.

The sweep, the launcher and the Trainer callback all log a session through these functions, so
`energy_j` (training steps only), `clock_mhz_measured`, `clock_held` and the flags mean the same
thing in every run.
"""
from __future__ import annotations

from typing import Any

from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.mlops import tracking

# Backend observations (FreqSession.context) that are numbers: logged as metrics.
_CONTEXT_METRICS = ("gpu_temp_c", "gpu_temp_c_end", "emc_mhz", "nvpmodel_gpu_max_mhz", "gpu_temp_c_max")
# ... and text: logged as params.
_CONTEXT_PARAMS = ("nvpmodel_mode",)


def report_metrics(report: EnergyReport) -> dict[str, float | None]:
    """The training window's energy, time, power, utilisation and the verified clock."""
    t = report.duration_s
    return {
        "energy_j": report.energy_j, "energy_gpu_j": report.energy_gpu_j, "energy_cpu_j": report.energy_cpu_j,
        "energy_total_j": report.energy_total_j, "avg_power_w": report.avg_power_w, "peak_power_w": report.peak_power_w,
        "time_s": t, "gpu_util_pct": report.gpu_util_pct, "clock_mhz_measured": report.clock_mhz_measured,
        "clock_held": None if report.clock_held is None else float(report.clock_held),
        "samples_failed": float(report.samples_failed),
        # the twin's noise-free values (None, so not logged, on real backends)
        "energy_expected_j": report.energy_expected_j, "time_expected_s": report.time_expected_s,
    }


def session_metrics(session: Any) -> dict[str, float | None]:
    """Evaluation and whole-session energy beside the training window, and numeric observations."""
    out: dict[str, float | None] = {}
    evaluation = session.windows.get("eval")
    if evaluation is not None:
        out["eval_energy_j"] = evaluation.energy_j
        out["eval_time_s"] = evaluation.duration_s
    whole = session.session_report()
    out["session_energy_j"] = whole.energy_j
    out["session_time_s"] = whole.duration_s
    for key in _CONTEXT_METRICS:
        value = session.context.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def session_tags(session: Any, report: EnergyReport) -> dict[str, str]:
    """Flags a reader must see: clock held or not, observe mode, a degraded meter, above the mode cap."""
    tags: dict[str, str] = {tracking.TAG_DEVICE_ID: str(getattr(session.device, "device_id", ""))}
    if report.clock_held is not None:
        tags[tracking.TAG_CLOCK_HELD] = str(report.clock_held).lower()
    if session.observe:
        tags[tracking.TAG_OBSERVE] = "true"
    if report.meter_degraded:
        tags[tracking.TAG_METER_DEGRADED] = "true"
    if session.context.get("above_mode_cap"):
        tags[tracking.TAG_ABOVE_MODE_CAP] = "true"
    return tags


def session_params(session: Any) -> dict[str, str]:
    device = session.device
    params = {k: str(session.context[k]) for k in _CONTEXT_PARAMS if k in session.context}
    if device.name == "nvml" or device.name == "jetson":
        params["device_index"] = str(getattr(device, "index", 0))
    return params


def point_metrics(report: EnergyReport, result: Any, effective_mhz: float | None,
                  session: Any = None) -> dict[str, float | None]:
    """A point's metrics (sweep and launcher alike): the training window (energy_j, time_s, ...), eval
    apart, the verified clock. `result` is a `finetune.FinetuneResult`."""
    t = report.duration_s
    samples = result.train_samples
    return {
        **report_metrics(report), result.eval_metric: result.eval_value, **getattr(result, "extra_metrics", {}),
        "samples_per_s": samples / t if t > 0 else None, "energy_per_sample_j": report.energy_j / samples if samples else None,
        "wall_time_s": result.wall_time_s, "clock_mhz": effective_mhz,
        **(session_metrics(session) if session is not None else {}),
    }
