"""Draw docs/figures/energy-curve.png: the twin's energy per training step against the GPU clock (SIMULATED).

The curves are `dvfs-mlops simulate MODEL --task TASK --json` (the `dvfs-mlops` on PATH): the simulated AGX Orin 64 GB's
noise-free time and energy of one training step at every clock of its table and under MAXN. Each curve marks MAXN and
its energy-optimal clock; `--picked MODEL/TASK=MHZ` marks the clock a governor picked for that workload (the main job's
`finetune --dry-run` prints it as `decision: ...`).

    python docs/figures/energy_curve.py [--workload bert-base/rte ...] [--picked bert-base/rte=816] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

OUT = Path(__file__).resolve().parent / "energy-curve.png"
WORKLOADS = ("bert-base/rte", "pythia-410m/qnli", "bert-mini/sst2")


def curve(workload: str) -> dict:
    """The twin's per-step curve of MODEL/TASK, as `dvfs-mlops simulate --json` prints it."""
    model, task = workload.split("/")
    out = subprocess.run(["dvfs-mlops", "simulate", model, "--task", task, "--json"], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def draw(workloads: list[str], picked: dict[str, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for workload in workloads:
        data = curve(workload)
        points = data["points"]
        e_maxn = data["maxn"]["energy_j"]
        freqs = [p["freq_mhz"] for p in points]
        rel = [100.0 * p["energy_j"] / e_maxn for p in points]
        best = min(range(len(rel)), key=rel.__getitem__)
        label = (f"{workload} ({data['num_params'] / 1e6:.0f}M params): optimum {freqs[best]:g} MHz, "
                 f"{100 - rel[best]:.0f} % less than MAXN")
        (line,) = ax.plot(freqs, rel, marker="o", ms=3.5, label=label)
        ax.plot(freqs[best], rel[best], marker="v", ms=9, color=line.get_color())
        if workload in picked:
            f = picked[workload]
            i = min(range(len(freqs)), key=lambda k: abs(freqs[k] - f))
            ax.plot(freqs[i], rel[i], marker="*", ms=14, mfc="none", mew=1.5, color="black")
            ax.annotate(f"governor's pick {f:g} MHz", (freqs[i], rel[i]), textcoords="offset points", xytext=(10, 18),
                        fontsize=8)
    ax.axhline(100.0, color="grey", lw=0.8, ls="--")
    ax.text(830, 101.0, "MAXN (the default governor)", fontsize=8, color="grey")
    ax.set_xlabel("GPU clock (MHz)")
    ax.set_ylabel("energy per training step (% of MAXN)")
    ax.set_title("SIMULATED: energy against the GPU clock on the AGX Orin 64 GB twin (sim-orin)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out} (SIMULATED)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", help=f"MODEL/TASK (repeat; default: {', '.join(WORKLOADS)})")
    parser.add_argument("--picked", action="append", default=[], help="MODEL/TASK=MHZ: a governor's pick to mark")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    picked = {k: float(v) for k, v in (p.split("=", 1) for p in args.picked)}
    draw(args.workload or list(WORKLOADS), picked, args.out)


if __name__ == "__main__":
    main()
