"""A finished sweep's best configuration per workload, from its FINISHED points (`sweep --json` of a joint sweep).

Each configuration's repeats are averaged; the best is the pinned configuration of least mean energy (`energy_j`, the
training window; on a joint sweep of the twin `energy_joint_j`, the rails the CPU and memory clocks feed included).
On the twin the figures are SIMULATED (one noisy draw per
point: judge policies on the twin's expected values, `dvfs-mlops evaluate`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN, Setting
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.sweep.artifacts import WorkloadPick

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def _number(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


def sweep_best(c: MlflowClient, experiment_id: str, sweep_id: str,
               played: Callable[[Setting], Setting] | None = None) -> list[WorkloadPick]:
    """Each workload's best configuration among the sweep's FINISHED points, in the order first measured.

    Args:
        c: the MLflow client.
        experiment_id: the sweep's experiment.
        sweep_id: the sweep.
        played: the configuration the device plays for one with clocks left alone (None): a replay device's file
            values (`ReplayDevice.setting`); None: left as recorded.

    Returns:
        One `WorkloadPick` per workload with at least one pinned point: the configuration of least mean energy
        among the pinned ones (its clocks as `played` shows them), its mean energy and time, and how many distinct
        pinned configurations were measured (maxn apart).
    """
    where = f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'"
    runs: dict[str, dict[Setting | str, list[tuple[float, float]]]] = {}
    for r in sorted(c.search_runs([experiment_id], filter_string=where, max_results=50000), key=lambda r: r.info.start_time):
        workload, p, m = r.data.tags.get(schema.TAG_WORKLOAD), r.data.params, r.data.metrics
        if not workload or "energy_j" not in m or "time_s" not in m or "freq_mhz" not in p:
            continue
        key: Setting | str = MAXN if p["freq_mhz"] == MAXN else Setting(float(p["freq_mhz"]), _number(p.get("cpu_freq_mhz")),
                                                                         _number(p.get("emc_freq_mhz")))
        runs.setdefault(workload, {}).setdefault(key, []).append((m.get("energy_joint_j", m["energy_j"]), m["time_s"]))
    out = []
    for workload, by_config in runs.items():
        means = {k: (math.fsum(e for e, _ in v) / len(v), math.fsum(t for _, t in v) / len(v)) for k, v in by_config.items()}
        pinned = {k: v for k, v in means.items() if isinstance(k, Setting)}
        if not pinned:
            continue
        best = min(pinned, key=lambda k: (pinned[k][0], -k.gpu_mhz))
        s = played(best) if played is not None else best
        out.append(WorkloadPick(workload, s.gpu_mhz, pinned[best][0], pinned[best][1], len(pinned), s.cpu_mhz, s.emc_mhz))
    return out
