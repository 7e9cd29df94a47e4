"""`dvfs-mlops simulate`: the twin's energy curve for one model and batch shape."""
from __future__ import annotations

from typing import Any

from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import energy_curve, estimate_maxn
from dvfs_mlops.hw.twin.profiles import load_twin_params
from dvfs_mlops.hw.twin.trace import TraceCache
from dvfs_mlops.job.workloads.tokenizer import PAD_TO_MULTIPLE
from dvfs_mlops.job.workloads.zoo import resolve_model


def simulate_curve(model: str | None, model_config: str | None, seq_len: int | None, batch_size: int = 16,
                   dtype: str = "float32", twin_params: str | None = None, cache: TraceCache | None = None, *,
                   params: OrinTwinParams | None = None, task: str | None = None) -> dict[str, Any]:
    """`params` (a profile's constants) wins; else `twin_params`, a YAML of overrides on sim-orin.

    `task` traces that task's head (a causal-LM task: the LM head and its loss; else a 2-label classifier, the
    default); `seq_len` None is the task's mean token length, padded as batches are."""
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.job.workloads.features import classifier_config
    from dvfs_mlops.job.workloads.tasks import get_task
    from dvfs_mlops.job.workloads.zoo import check_task_model

    spec = resolve_model(model, model_config)
    task_spec = get_task(task) if task else None
    if seq_len is None:
        if task_spec is None:
            raise DvfsError("give --seq-len N, or --task TASK for that task's mean length")
        seq_len = -(-task_spec.mean_tokens // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
    if params is None:
        params = load_twin_params(None, twin_params)
    if task_spec is not None and task_spec.causal_lm:
        check_task_model(spec, task_spec.name, task_spec.kind)
        config = classifier_config(spec, task_spec.num_labels, None, task_spec.kind)
        trace = (cache or TraceCache()).get(config, batch_size, seq_len, dtype, task_spec.num_labels, kind=task_spec.kind)
    elif task_spec is not None:
        trace = (cache or TraceCache()).get(spec.config, batch_size, seq_len, dtype, task_spec.num_labels)
    else:
        trace = (cache or TraceCache()).get(spec.config, batch_size, seq_len, dtype)
    curve = energy_curve(trace, params)
    maxn = estimate_maxn(trace, params, curve)
    points = [
        {"freq_mhz": f, "time_s": e.time_s, "avg_power_w": e.avg_power_w, "energy_j": e.energy_j,
         "energy_total_j": e.energy_total_j, "gpu_util_pct": 100 * e.gpu_util}
        for f, e in sorted(curve.items())
    ]
    optimal = min(points, key=lambda p: p["energy_j"])
    return {
        "model": spec.name,
        "task": task_spec.name if task_spec is not None else None,
        "simulated": True,
        "device_profile": params.profile,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "dtype": dtype,
        "num_params": trace.num_params,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "points": points,
        "maxn": {"freq_mhz": "maxn", "settled_mhz": maxn.settled_mhz, "time_s": maxn.time_s, "avg_power_w": maxn.avg_power_w,
                 "energy_j": maxn.energy_j, "energy_total_j": maxn.energy_total_j, "gpu_util_pct": 100 * maxn.gpu_util},
        "optimal_freq_mhz": optimal["freq_mhz"],
        "saving_vs_maxn": 1.0 - optimal["energy_j"] / maxn.energy_j,
    }
