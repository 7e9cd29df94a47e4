"""Fit error of the curve model on public real-GPU clock sweeps (issue 14).

For each dataset under benchmarks/data/public/ (rows freq_mhz,time_s,energy_j; the source of each is in
its sibling .md), the model is fitted on 4 measured clocks spread over the range (lowest, the nearest to
1/3 and 2/3 of the range, highest, as 306/612/918/1300.5 on the Orin) and judged on every other measured
clock: the mean and max absolute relative energy error there, the predicted optimum against the measured
argmin over all measured clocks, and the measured regret of the predicted optimum
(E_measured(predicted optimum) / E_measured(argmin) - 1).

    python -m benchmarks.public_curves            # one line per dataset
    python -m benchmarks.public_curves --fit-shape  # also with r fitted on the same 4 clocks (fit_voltage_shape)
    python -m benchmarks.public_curves --rebuild    # regenerate the CSVs from raw/ (the verbatim source rows)
    python -m benchmarks curves                     # both lines per dataset, as rows of the benchmark report

No network; numpy and dvfs_mlops.model.curve only. The voltage shape is the module's ORIN_VOLTAGE_SHAPE unless
a dataset is an Orin's (none of these is): for these boards it is NOT the board's own curve.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from dvfs_mlops.model.curve import ORIN_VOLTAGE_SHAPE, fit_curve, fit_voltage_shape, read_measurements_csv

DATA = Path(__file__).resolve().parent / "data" / "public"
# name -> device (for the printout); the shape is the Orin's default for all of them (none is an Orin)
DATASETS = {
    "perseus-bloom-a100sxm": "A100-80G SXM",
    "perseus-gpt3-175b-a100sxm": "A100-80G SXM",
    "perseus-bloom-a40": "A40-48G",
}


def rebuild(name: str) -> Path:
    """Sum the forward and backward instruction of stage 0 at each clock (one microbatch's fwd+bwd on one GPU)."""
    with open(DATA / "raw" / f"{name}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    acc: dict[int, list[float]] = {}
    for r in rows:
        if r["stage"] != "0":
            continue
        a = acc.setdefault(int(r["frequency"]), [0.0, 0.0, 0])
        a[0] += float(r["time"])
        a[1] += float(r["energy"])
        a[2] += 1
    out = DATA / f"{name}.csv"
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["freq_mhz", "time_s", "energy_j"])
        for freq in sorted(acc):
            t, e, n = acc[freq]
            if n != 2:
                raise SystemExit(f"{name}: {freq} MHz has {n} instructions, expected forward + backward")
            w.writerow([freq, f"{t:.9g}", f"{e:.9g}"])
    return out


def spread4(freqs: list[float]) -> list[float]:
    lo, hi = freqs[0], freqs[-1]
    mids = [min(freqs, key=lambda f: (abs(f - (lo + k * (hi - lo) / 3)), f)) for k in (1, 2)]
    return [lo, *mids, hi]


def evaluate(name: str, shape: float | None) -> dict:
    pts = sorted(read_measurements_csv(str(DATA / f"{name}.csv")), key=lambda m: m.freq_mhz)
    freqs = [m.freq_mhz for m in pts]
    fit_clocks = spread4(freqs)
    fit_pts = [m for m in pts if m.freq_mhz in fit_clocks]
    if shape is None:
        shape = fit_voltage_shape([fit_pts], f_max_mhz=freqs[-1])
    fit = fit_curve(fit_pts, voltage_shape=shape, f_max_mhz=freqs[-1])
    pred = {p.freq_mhz: p.energy_j for p in fit.predict(freqs)}
    meas = {m.freq_mhz: m.energy_j for m in pts}
    held = [f for f in freqs if f not in fit_clocks]
    err = np.array([abs(pred[f] / meas[f] - 1.0) for f in held])
    f_pred = fit.optimum(freqs).freq_mhz
    f_true = min(freqs, key=lambda f: meas[f])
    return {
        "name": name, "device": DATASETS.get(name, "?"), "clocks": len(freqs), "fit": fit_clocks, "shape": shape,
        "mean_err": float(err.mean()), "max_err": float(err.max()), "worst_at": held[int(err.argmax())],
        "pred_opt": f_pred, "true_opt": f_true,
        "regret": meas[f_pred] / meas[f_true] - 1.0,
        "saving_at_true_opt": 1.0 - meas[f_true] / meas[freqs[-1]],
    }


def line(r: dict) -> str:
    fit = "/".join(f"{f:g}" for f in r["fit"])
    return (f"{r['name']:<28} {r['device']:<15} {r['clocks']:>2} clocks, fit on {fit} MHz, r={r['shape']:.3f}: "
            f"held-out energy error mean {r['mean_err']:.1%} max {r['max_err']:.1%} (at {r['worst_at']:g}); "
            f"optimum predicted {r['pred_opt']:g} vs measured {r['true_opt']:g} MHz, regret {r['regret']:.1%} "
            f"(measured argmin saves {r['saving_at_true_opt']:.1%} vs the top clock)")


def run() -> list[tuple[str, str, str]]:
    """The suite `curves` of `python -m benchmarks`: one row per dataset with the Orin's voltage shape, one with r
    fitted on the same 4 clocks."""
    rows = []
    for name in DATASETS:
        for label, shape in (("Orin shape", ORIN_VOLTAGE_SHAPE), ("r fitted", None)):
            r = evaluate(name, shape)
            rows.append(((f"REAL {name} ({r['device']}, {r['clocks']} clocks; fit on 4, {label} r={r['shape']:.3f}): held-out "
                         "energy error mean / max; regret of the predicted optimum"),
                         f"{r['mean_err']:.1%} / {r['max_err']:.1%}; {r['regret']:.1%} ({r['pred_opt']:g} vs {r['true_opt']:g} MHz)", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="regenerate the CSVs from raw/ first")
    ap.add_argument("--fit-shape", action="store_true", help="also fit r on the same 4 clocks (fit_voltage_shape)")
    args = ap.parse_args(argv)
    for name in DATASETS:
        if args.rebuild:
            rebuild(name)
        print(line(evaluate(name, ORIN_VOLTAGE_SHAPE)))
        if args.fit_shape:
            print("  " + line(evaluate(name, None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
