"""The parent run's artifacts of a complete sweep: summary.csv and the per-workload plots."""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.clocks import MAXN, Setting
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.queries import sweep_frame


def log_sweep_artifacts(c: Any, exp_id: str, parent_id: str, sweep_id: str, simulated: bool, replayed: bool = False) -> None:
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
        points_measured: the distinct settings pinned (a grid sweep of N clocks: N; on a replayed grid maxn looks the
            top setting up, counted with it; on a joint sweep the configurations pinned, maxn apart).
        cpu_mhz: the CPU clock of the pick where the sweep tunes clocks besides the GPU's (a replayed grid's own
            value for one left alone); None on a GPU-only sweep.
        emc_mhz: the memory clock of the pick, the same way.
    """

    workload: str
    gpu_mhz: float
    energy_j: float
    time_s: float
    points_measured: int
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    def to_json(self) -> dict[str, Any]:
        """`{"workload", "best": {"gpu_mhz", "energy_j", "time_s"}, "points_measured"}`, the best's `cpu_mhz` and
        `emc_mhz` where it has them."""
        best: dict[str, Any] = {"gpu_mhz": self.gpu_mhz, "energy_j": self.energy_j, "time_s": self.time_s}
        best.update({k: v for k, v in (("cpu_mhz", self.cpu_mhz), ("emc_mhz", self.emc_mhz)) if v is not None})
        return {"workload": self.workload, "best": best, "points_measured": self.points_measured}


def workload_picks(exp_id: str, sweep_id: str, board: Board, spec: Any, played: Callable[[Setting], Setting] | None = None) -> list[WorkloadPick]:
    """Per workload of a sweep's FINISHED points, in the order first measured, what the sweep recommends: the measured
    minimum of energy among its pinned clocks (configurations) on a grid sweep and a joint one (`best.sweep_best`), the
    curve model's predicted optimum on a GPU-only adaptive sweep (as predicted.csv marks it).

    Args:
        exp_id: the sweep's experiment id.
        sweep_id: the sweep.
        board: its board (the clock table; a replayed grid's maxn is its top setting).
        spec: the sweep's `SweepSpec` (its strategy, whether it tunes CPU or memory clocks).
        played: a replay device's setting for a configuration with clocks left alone (its file's values).

    Returns:
        One `WorkloadPick` per workload with a pinned clock measured.
    """
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.sweep.best import sweep_best

    replayed = board.backend == "replay"
    if spec.joint:
        return [WorkloadPick(w.workload, w.best.gpu_mhz, w.energy_j, w.time_s, w.configurations, w.best.cpu_mhz, w.best.emc_mhz)
                for w in sweep_best(tracking.client(), exp_id, sweep_id, played)]
    from dvfs_mlops.mlops.sweep.adaptive import predicted_rows
    from dvfs_mlops.model.curve import Measurement

    df = sweep_frame([exp_id], sweep_id)
    needed = {"params.freq_mhz", "metrics.energy_j", "metrics.time_s", f"tags.{schema.TAG_WORKLOAD}"}
    if not len(df) or not needed <= set(df.columns):
        return []
    df = df.sort_values("start_time")
    top = max(board.frequencies_mhz)
    per_workload = []  # (workload, its pinned clocks' means, settings measured, the clocks pinned as such)
    for workload in dict.fromkeys(df[f"tags.{schema.TAG_WORKLOAD}"]):
        g = df[df[f"tags.{schema.TAG_WORKLOAD}"] == workload]
        clocks = g["params.freq_mhz"].map(lambda f: (top if replayed else None) if f == MAXN else float(f))
        pinned = g.assign(_f=clocks).dropna(subset=["_f"]).groupby("_f")[["metrics.energy_j", "metrics.time_s"]].mean()
        if not pinned.empty:
            per_workload.append((str(workload), pinned, len(pinned), {float(f) for f in g["params.freq_mhz"] if f != MAXN}))
    predicted: dict[str, list[str]] = {}
    if spec.strategy == "adaptive":  # the curve model's optimum from the pinned clocks, as predicted.csv has it
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
        picks.append(WorkloadPick(workload, best, energy, time_s, settings))  # the GPU alone: no CPU or memory clock
    return picks
