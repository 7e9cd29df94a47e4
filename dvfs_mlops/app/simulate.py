"""`dvfs-mlops simulate`: the twin's energy curve for one model and batch shape."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import energy_curve, estimate_maxn
from dvfs_mlops.hw.twin.profiles import load_twin_params
from dvfs_mlops.hw.twin.trace import TraceCache
from dvfs_mlops.job.workloads.tokenizer import PAD_TO_MULTIPLE
from dvfs_mlops.job.workloads.zoo import resolve_model

if TYPE_CHECKING:
    from dvfs_mlops.app.devices import DeviceChoice


@dataclasses.dataclass(frozen=True)
class SimulateRequest:
    """What `dvfs-mlops simulate` is asked.

    Attributes:
        model: a model preset (or None with `model_config`).
        model_config: a transformers config.json or folder instead of a preset.
        seq_len: the padded sequence length of a batch (None: the task's mean length).
        task: trace this task's head ('' none: the bare model).
        batch_size: examples per training step.
        precision: fp32, bf16 or fp16.
    """

    model: str | None = None
    model_config: str | None = None
    seq_len: int | None = None
    task: str = ""
    batch_size: int = 16
    precision: str = "fp32"


def simulate_command(request: SimulateRequest, twin: DeviceChoice) -> dict[str, Any]:
    """`dvfs-mlops simulate`: the twin's curve for the request, on the twin that `twin`'s profile options choose.

    Args:
        request: the model, batch shape, task and precision.
        twin: the --twin-profile/--twin-params choice.

    Returns:
        The curve as `simulate_curve` returns it (the `--json` object).

    Raises:
        DvfsError: both MODEL and --model-config, an unknown model, task or twin profile, a task the model cannot
            train, or no sequence length.
    """
    from dvfs_mlops.app.devices import load_twin
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.job.finetune import PRECISIONS

    r = request
    dtype = PRECISIONS[r.precision]
    if r.model and r.model_config:
        raise DvfsError("give either MODEL or --model-config, not both")
    if r.seq_len is None and not r.task:  # the task's mean length stands in for it
        raise DvfsError("Missing option '--seq-len' (or --task, whose mean length stands in for it)")
    return simulate_curve(r.model, r.model_config, r.seq_len, r.batch_size, dtype, params=load_twin(twin), task=r.task or None)


def curve_lines(result: dict[str, Any]) -> list[str]:
    """The curve as `dvfs-mlops simulate` prints it: a heading, one row per clock and maxn, the optimum."""
    on_task = f" on {result['task']}" if result["task"] else ""
    lines = [(f"{result['model']}{on_task}: batch {result['batch_size']}, seq {result['seq_len']}, "
              f"{result['num_params'] / 1e6:.1f}M params on {result['device_profile']} (SIMULATED)"),
             f"{'freq_mhz':>9} {'time_s':>9} {'power_w':>8} {'energy_j':>9} {'gpu_util':>8}"]
    for pt in [*result["points"], result["maxn"]]:
        f = pt["freq_mhz"]
        name = f"maxn@{pt['settled_mhz']:g}" if f == "maxn" else f"{f:g}"
        mark = " <- optimal" if f == result["optimal_freq_mhz"] else ""
        lines.append(f"{name:>9} {pt['time_s']:9.4f} {pt['avg_power_w']:8.2f} {pt['energy_j']:9.4f} {pt['gpu_util_pct']:7.1f}%{mark}")
    lines.append(f"energy-optimal: {result['optimal_freq_mhz']:g} MHz, saving {100 * result['saving_vs_maxn']:.1f}% vs maxn (simulated)")
    return lines


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
