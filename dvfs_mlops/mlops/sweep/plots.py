"""Figures for sweeps: energy, time and power against the GPU clock, MAXN marked; a sweep that tunes the CPU or memory
clock too draws one line per (CPU, EMC) pair and marks the best configuration."""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

KNOB_COLUMNS = ["cpu_freq_mhz", "emc_freq_mhz"]  # a joint sweep's CPU and memory clocks (absent in a GPU-only sweep)
PLOTTED = ["freq_mhz", *KNOB_COLUMNS, "energy_j", "time_s", "avg_power_w"]


def plot_workload_curves(summary: pd.DataFrame, out_dir: Path, simulated: bool, replayed: bool = False) -> list[Path]:
    """One PNG per workload (three panels), from the sweep's summary table; a twin's titled SIMULATED, a replayed
    grid's REPLAYED (a grid workload, without a task, is named as the file writes it).

    Every invocation of a sweep logs the whole sweep's figures on its own parent run. A figure is drawn once per
    content (drawing is most of a rerun's time, docs: the loop): a workload
    whose plotted rows are unchanged (a rerun, the untouched workloads of a resumed sweep) is copied from
    `$DVFS_CACHE_DIR/workloads/figures/` (keyed by those rows, this module's code and matplotlib's
    version), and matplotlib is not even imported when nothing needs drawing."""
    from dvfs_mlops.job.workloads.cache import cache_dir, code_digest, digest, dist_version, store_file

    paths = []
    for (model, task), g in summary.groupby(["model", "task"]):
        name = f"{model}_{task}" if task else str(model)
        path = out_dir / (re.sub(r"[^A-Za-z0-9._+-]", "_", name) + ".png")
        profile = str(g["device_profile"].iloc[0]) if "device_profile" in g.columns else "sim-orin"
        title = f"{model} / {task}" if task else str(model)
        title += f"  (SIMULATED: {profile} twin)" if simulated else f"  (REPLAYED: {profile} grid)" if replayed else ""
        key = digest(["figure/1", code_digest("mlops.sweep.plots"), dist_version("matplotlib"), title,
                      g[[c for c in PLOTTED if c in g.columns]].to_csv(index=False)])
        if not _copy(cache_dir("figures") / f"{key}.png", path):
            _draw(title, g, path)
            store_file("figures", f"{key}.png", path)
        paths.append(path)
    return paths


def _copy(cached: Path, path: Path) -> bool:
    """The cached figure copied to `path`; False when there is none (or it cannot be read: it is drawn instead)."""
    try:
        shutil.copyfile(cached, path)
        return True
    except OSError:
        return False


def _draw(title: str, g: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pinned = g[g["freq_mhz"] != "maxn"].copy()
    pinned["f"] = pinned["freq_mhz"].astype(float)
    knobs = [c for c in KNOB_COLUMNS if c in pinned.columns and pinned[c].notna().any()]
    columns = ["energy_j", "time_s", "avg_power_w"]
    lines = ([(("pinned clock",), pinned)] if not knobs else
             [(pair, part) for pair, part in pinned.fillna({k: "" for k in knobs}).groupby(knobs)])
    curves = [(_pair_label(knobs, pair), part.groupby("f")[columns].mean().sort_index()) for pair, part in lines]
    maxn = g[g["freq_mhz"] == "maxn"][columns].mean()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col, ylabel in zip(axes, columns, ["energy (J)", "time (s)", "power (W)"]):
        for label, curve in curves:
            ax.plot(curve.index, curve[col], "o-", ms=3 if knobs else 6, label=label if len(curves) <= 8 else None)
        if col in maxn and maxn[col] == maxn[col]:
            ax.axhline(maxn[col], color="tab:red", ls="--", label="MAXN")
        if col == "energy_j" and curves:
            label, curve = min(((lb, c) for lb, c in curves if len(c)), key=lambda lc: lc[1][col].min())
            best = curve[col].idxmin()
            where = f"{best:g} MHz" + (f" ({label})" if knobs else "")
            ax.plot([best], [curve[col].min()], "*", ms=14, color="tab:green", label=f"optimum {where}")
        ax.set_xlabel("GPU clock (MHz)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _pair_label(knobs: list[str], pair: Any) -> str:
    """A line's label: 'pinned clock', or its CPU and memory clocks ('CPU 1190.4 / EMC 2133 MHz')."""
    if not knobs:
        return "pinned clock"
    values = pair if isinstance(pair, tuple) else (pair,)
    return " / ".join(f"{k[:3].upper()} {v}" for k, v in zip(knobs, values) if v != "") + " MHz"
