"""The parent run's artifacts of a complete sweep: summary.csv and the per-workload plots."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.mlops.queries import sweep_frame

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def log_sweep_artifacts(c: MlflowClient, exp_id: str, parent_id: str, sweep_id: str, simulated: bool) -> None:
    from dvfs_mlops.mlops.sweep.plots import plot_workload_curves

    df = sweep_frame([exp_id], sweep_id)
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
