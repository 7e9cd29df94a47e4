"""The parent run's artifacts of a complete sweep: summary.csv and the per-workload plots."""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.queries import sweep_frame

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def log_sweep_artifacts(c: MlflowClient, exp_id: str, parent_id: str, sweep_id: str, simulated: bool, replayed: bool = False) -> None:
    """The parent run's summary.csv (every point run's params, metrics and dvfs tags) and one figure per workload
    (labelled SIMULATED on the twin, REPLAYED on a measured grid)."""
    from dvfs_mlops.mlops.sweep.plots import plot_workload_curves

    df = sweep_frame([exp_id], sweep_id)
    if not len(df):
        return
    with tempfile.TemporaryDirectory() as tmp:
        cols = [k for k in df.columns if k.startswith(("params.", "metrics.", "tags.dvfs"))] + ["run_id", "status"]
        summary = df[cols].rename(columns=lambda k: k.split(".", 1)[1] if k.startswith(("params.", "metrics.")) else k)
        if "task" not in summary:  # a replayed grid's workloads are names, without a task
            summary = summary.assign(task="")
        summary["task"] = summary["task"].fillna("")
        summary = summary.sort_values(["model", "task", "repeat", "freq_mhz"], key=lambda s: s.map(_sort_key))
        summary.to_csv(Path(tmp) / "summary.csv", index=False)
        c.log_artifact(parent_id, str(Path(tmp) / "summary.csv"))
        plots = Path(tmp) / "plots"
        plots.mkdir()
        plot_workload_curves(summary, plots, simulated, replayed=replayed)
        c.log_artifacts(parent_id, str(plots), artifact_path="plots")


def _sort_key(v: Any) -> Any:
    if v == MAXN:
        return -1.0
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


@dataclasses.dataclass(frozen=True)
class WorkloadPick:
    """What a finished sweep recommends for one workload (`sweep --json`).

    Attributes:
        workload: the workload, as the sweep names it (a replayed grid's: exactly as the file writes it).
        gpu_mhz: the recommended GPU clock as the table writes it (114.75, not 115).
        energy_j: its energy: measured (the mean of its repeats), or the curve model's prediction where an adaptive
            sweep picks a clock it did not measure.
        time_s: its time, the same way.
        points_measured: the distinct settings measured (a grid sweep of N clocks: N; maxn is the top setting on a
            replayed grid, a setting of its own elsewhere; a sweep tuning CPU or memory clocks: its configurations).
        cpu_mhz: a sweep tuning the CPU clock: the recommended one (None: not tuned).
        emc_mhz: a sweep tuning the memory clock: the recommended one (None: not tuned).
    """

    workload: str
    gpu_mhz: float
    energy_j: float
    time_s: float
    points_measured: int
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    def to_json(self) -> dict[str, Any]:
        """`{"workload", "best": {"gpu_mhz", "energy_j", "time_s"}, "points_measured"}`; `best` gains cpu_mhz and
        emc_mhz where the sweep tunes them."""
        best = {"gpu_mhz": self.gpu_mhz, "energy_j": self.energy_j, "time_s": self.time_s}
        best.update({k: v for k, v in (("cpu_mhz", self.cpu_mhz), ("emc_mhz", self.emc_mhz)) if v is not None})
        return {"workload": self.workload, "best": best, "points_measured": self.points_measured}


def workload_picks(exp_id: str, sweep_id: str, board: Board, strategy: str = "grid") -> list[WorkloadPick]:
    """Per workload of a sweep's FINISHED points, in the order first measured: the measured minimum of energy among its
    pinned clocks (grid), or the curve model's predicted optimum (adaptive, as predicted.csv marks it).

    Args:
        exp_id: the sweep's experiment id.
        sweep_id: the sweep.
        board: its board (the clock table; a replayed grid's maxn is its top clock).
        strategy: grid or adaptive.

    Returns:
        One `WorkloadPick` per workload with a pinned clock measured.
    """
    from dvfs_mlops.mlops.sweep.adaptive import predicted_rows
    from dvfs_mlops.model.curve import Measurement

    df = sweep_frame([exp_id], sweep_id)
    needed = {"params.freq_mhz", "metrics.energy_j", "metrics.time_s", f"tags.{schema.TAG_WORKLOAD}"}
    if not len(df) or not needed <= set(df.columns):
        return []
    df = df.sort_values("start_time")
    top = max(board.frequencies_mhz)
    replayed = board.backend == "replay"
    per_workload = []  # (workload, its pinned clocks' means, settings measured, the clocks pinned as such)
    for workload in dict.fromkeys(df[f"tags.{schema.TAG_WORKLOAD}"]):
        g = df[df[f"tags.{schema.TAG_WORKLOAD}"] == workload]
        clocks = g["params.freq_mhz"].map(lambda f: (top if replayed else None) if f == MAXN else float(f))
        pinned = g.assign(_f=clocks).dropna(subset=["_f"]).groupby("_f")[["metrics.energy_j", "metrics.time_s"]].mean()
        if not pinned.empty:
            settings = len(pinned) + int(not replayed and (g["params.freq_mhz"] == MAXN).any())
            per_workload.append((str(workload), pinned, settings, {float(f) for f in g["params.freq_mhz"] if f != MAXN}))
    predicted: dict[str, list[str]] = {}
    if strategy == "adaptive":  # the curve model's optimum from the pinned clocks, as predicted.csv has it
        measured = [(w, [Measurement(float(f), float(row["metrics.time_s"]), float(row["metrics.energy_j"]))
                         for f, row in pinned.iterrows() if f in as_pinned]) for w, pinned, _, as_pinned in per_workload]
        repeats = max(1, int(df.groupby([f"tags.{schema.TAG_WORKLOAD}", "params.freq_mhz"]).size().median()))
        text, _ = predicted_rows(measured, board, repeats)
        predicted = {row[0]: row for row in (line.split(",") for line in text.splitlines()[1:]) if row[-1] == "1"}
    picks = []
    for workload, pinned, settings, _ in per_workload:
        best = float(pinned["metrics.energy_j"].idxmin())
        if workload in predicted:
            best = float(predicted[workload][1])
        if best in pinned.index:
            energy, time_s = float(pinned.loc[best, "metrics.energy_j"]), float(pinned.loc[best, "metrics.time_s"])
        else:  # the curve model's prediction (predicted.csv's columns)
            energy, time_s = float(predicted[workload][4]), float(predicted[workload][2])
        picks.append(WorkloadPick(workload, best, energy, time_s, settings))
    return picks
