"""Figures for sweeps: energy, time and power against the GPU clock, MAXN marked."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_workload_curves(summary: Any, out_dir: Path, simulated: bool) -> list[Path]:
    """One PNG per workload (three panels), from the sweep's summary table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for (model, task), g in summary.groupby(["model", "task"]):
        pinned = g[g["freq_mhz"] != "maxn"].copy()
        pinned["f"] = pinned["freq_mhz"].astype(float)
        curve = pinned.groupby("f")[["energy_j", "time_s", "avg_power_w"]].mean().sort_index()
        maxn = g[g["freq_mhz"] == "maxn"][["energy_j", "time_s", "avg_power_w"]].mean()
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, col, ylabel in zip(axes, ["energy_j", "time_s", "avg_power_w"], ["energy (J)", "time (s)", "power (W)"]):
            ax.plot(curve.index, curve[col], "o-", label="pinned clock")
            if col in maxn and maxn[col] == maxn[col]:
                ax.axhline(maxn[col], color="tab:red", ls="--", label="MAXN")
            if col == "energy_j" and len(curve):
                best = curve[col].idxmin()
                ax.plot([best], [curve[col].min()], "*", ms=14, color="tab:green", label=f"optimum {best:g} MHz")
            ax.set_xlabel("GPU clock (MHz)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{model} / {task}" + ("  (SIMULATED: sim-orin twin)" if simulated else ""))
        fig.tight_layout()
        path = out_dir / f"{model}_{task}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
