"""The board power prior on synthetic boards whose workloads differ more or less (SIMULATED, not the twin).

The prior assumes a board's workloads share most of their dynamic-to-static power ratio k once their
GPU utilisation is accounted for. The twin's do (they differ only through the CPU's share), so the
twin alone cannot say what the prior costs where that assumption is wrong. Here each board has 14
workloads of the prior's own power form whose log k scatters by SPREAD around the board's; each
workload is measured adaptively (`curve.next_clock` without a prior, 1 %/2 % noise per window, start
816 MHz), and the predicted optimum of the plain per-workload fit and of the fit with the leave-one-out
prior are judged against the true curve (share within 0.2 % of the optimum; the same clocks and draws
for both, so the comparison is paired).
6 boards x 12 sweeps per spread (1008 draws; one standard error is about 0.6-0.8 points).
"""
from __future__ import annotations

import math
import os

import numpy as np

TABLE = (306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5)
IDLE = 0.15
SPREADS = (0.0, 0.03, 0.06, 0.1, 0.2)


def board_workload(i: int, spread: float, board: int) -> dict[str, float]:
    """Workload i of a synthetic board: its own time split (fixed part, clock-bound part, GPU busy part) and static
    power; its dynamic/static ratio k scattered around the board's (0.8) by `spread` (log)."""
    rng = np.random.default_rng(1000 * board + i)
    a, b = rng.uniform(0.002, 0.03), rng.uniform(0.01, 0.06)
    return {"a": a, "b": b, "busy_a": a * rng.uniform(0.0, 0.3), "c": rng.uniform(8.0, 20.0),
            "k": math.exp(math.log(0.8) + spread * rng.standard_normal())}


def truth(w: dict[str, float], f: float) -> tuple[float, float, float]:
    """(time, power, GPU busy share) at clock f: power = c (1 + k V^2 f (s + (1 - s) u))."""
    from dvfs_mlops.model.curve import ORIN_VOLTAGE_SHAPE

    g = f / 1000.0
    t = w["a"] + w["b"] / g
    u = min(1.0, (w["busy_a"] + w["b"] / g) / t)
    v = 1 + ORIN_VOLTAGE_SHAPE * (f / 1300.5) ** 2
    return t, w["c"] * (1 + w["k"] * v * v * g * (IDLE + (1 - IDLE) * u)), u


def run_spread(spread: float, boards: int = 6, sweeps: int = 12) -> tuple[float, float, int]:
    """(share within 0.2 % alone, with the prior, draws) over boards 1..`boards`, `sweeps` adaptive sweeps each."""
    from dvfs_mlops.model.curve import ORIN_VOLTAGE_SHAPE, Measurement, fit_curve, next_clock
    from dvfs_mlops.model.power_prior import leave_one_out_priors

    ok = {"alone": 0, "prior": 0}
    n = 0
    for board in range(1, boards + 1):
        rng = np.random.default_rng(board)
        workloads = [board_workload(i, spread, board) for i in range(14)]
        energies = [{f: truth(w, f)[0] * truth(w, f)[1] for f in TABLE} for w in workloads]
        for _ in range(sweeps):
            sweep = []
            for w in workloads:
                got: list[Measurement] = []
                while (f := next_clock(got, TABLE, 816.0, noise=(0.01, 0.02))) is not None:
                    t, p, u = truth(w, f)
                    t *= 1 + 0.01 * rng.standard_normal()
                    got.append(Measurement(f, t, t * p * (1 + 0.02 * rng.standard_normal()), u))
                sweep.append(got)
            priors = leave_one_out_priors(sweep, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=1300.5, noise=0.02)
            for got, prior, e in zip(sweep, priors, energies):
                for name, pr in (("alone", None), ("prior", prior)):
                    best = fit_curve(got, f_max_mhz=1300.5, noise=(0.01, 0.02), prior=pr).optimum(TABLE).freq_mhz
                    ok[name] += e[best] / min(e.values()) - 1 <= 0.002
                n += 1
    return ok["alone"] / n, ok["prior"] / n, n


def run() -> list[tuple[str, str, str]]:
    spreads = [float(x) for x in os.environ.get("DVFS_BENCH_PRIOR_SPREADS", ",".join(map(str, SPREADS))).split(",")]
    rows = []
    for s in spreads:
        alone, prior, n = run_spread(s)
        rows.append((f"synthetic boards, workloads' log k spread {s:g}: share within 0.2 %, each fit alone -> with the prior ({n} draws)",
                     f"{100 * alone:.1f} % -> {100 * prior:.1f} %", "- (what the prior costs where its assumption is off)"))
    return rows
