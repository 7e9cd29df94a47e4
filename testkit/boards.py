"""Synthetic boards for the power prior: workloads of the prior's own power form, and adaptive sweeps of them.

The board power prior (`dvfs_mlops.model.power_prior`) assumes a board's workloads share most of their
dynamic-to-static power ratio k once their GPU utilisation is accounted for. The twin's workloads do, so
the twin alone cannot say what the prior costs where that assumption is wrong. A synthetic board can:
each of its workloads has its own time split (a fixed part, a clock-bound part, a GPU-busy part) and
static power, and its log k scatters by a chosen spread around the board's (k = 0.8). `truth` gives a
workload's exact time, power and GPU busy share at a clock on the Orin's table (`TABLE`, idle share
`IDLE`), and `run_spread` sweeps whole boards adaptively under noise and judges the predicted optima.

Shared by tests/test_power_prior.py (the prior's properties on known truths) and
benchmarks/prior_robustness.py (what the prior costs as the spread grows). SIMULATED, not the twin.
"""
from __future__ import annotations

import math

import numpy as np

from dvfs_mlops.model.curve import ORIN_VOLTAGE_SHAPE, Measurement, fit_curve, next_clock
from dvfs_mlops.model.power_prior import leave_one_out_priors

TABLE = (306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5)
IDLE = 0.15
F_MAX = 1300.5
WORKLOADS_PER_BOARD = 14


def board_workload(i: int, spread: float, board: int) -> dict[str, float]:
    """Workload i of a synthetic board: its own time split (fixed part, clock-bound part, GPU busy part) and static
    power; its dynamic/static ratio k scattered around the board's (0.8) by `spread` (log)."""
    rng = np.random.default_rng(1000 * board + i)
    a, b = rng.uniform(0.002, 0.03), rng.uniform(0.01, 0.06)
    return {"a": a, "b": b, "busy_a": a * rng.uniform(0.0, 0.3), "c": rng.uniform(8.0, 20.0),
            "k": math.exp(math.log(0.8) + spread * rng.standard_normal())}


def truth(w: dict[str, float], f: float) -> tuple[float, float, float]:
    """(time, power, GPU busy share) at clock f: power = c (1 + k V^2 f (s + (1 - s) u))."""
    g = f / 1000.0
    t = w["a"] + w["b"] / g
    u = min(1.0, (w["busy_a"] + w["b"] / g) / t)
    v = 1 + ORIN_VOLTAGE_SHAPE * (f / F_MAX) ** 2
    return t, w["c"] * (1 + w["k"] * v * v * g * (IDLE + (1 - IDLE) * u)), u


def _sweep(workloads: list[dict[str, float]], rng: np.random.Generator) -> list[list[Measurement]]:
    """One adaptive sweep of a board: each workload measured at the clocks `next_clock` (no prior) asks for, from
    816 MHz, with 1 % time and 2 % energy noise per window."""
    sweep = []
    for w in workloads:
        got: list[Measurement] = []
        while (f := next_clock(got, TABLE, 816.0, noise=(0.01, 0.02))) is not None:
            t, p, u = truth(w, f)
            t *= 1 + 0.01 * rng.standard_normal()
            got.append(Measurement(f, t, t * p * (1 + 0.02 * rng.standard_normal()), u))
        sweep.append(got)
    return sweep


def run_spread(spread: float, boards: int = 6, sweeps: int = 12) -> tuple[float, float, int]:
    """(share within 0.2 % alone, with the prior, draws) over boards 1..`boards`, `sweeps` adaptive sweeps each.

    Each board has `WORKLOADS_PER_BOARD` workloads whose log k scatters by `spread`; each sweep's predicted optimum
    of every workload comes from the plain fit and from the fit with the leave-one-out prior of the same sweep (the
    same clocks and draws for both, so the comparison is paired), judged against the true energy curve."""
    ok = {"alone": 0, "prior": 0}
    n = 0
    for board in range(1, boards + 1):
        rng = np.random.default_rng(board)
        workloads = [board_workload(i, spread, board) for i in range(WORKLOADS_PER_BOARD)]
        energies = [{f: truth(w, f)[0] * truth(w, f)[1] for f in TABLE} for w in workloads]
        for _ in range(sweeps):
            sweep = _sweep(workloads, rng)
            priors = leave_one_out_priors(sweep, voltage_shape=ORIN_VOLTAGE_SHAPE, f_max_mhz=F_MAX, noise=0.02)
            for got, prior, e in zip(sweep, priors, energies):
                for name, pr in (("alone", None), ("prior", prior)):
                    best = fit_curve(got, f_max_mhz=F_MAX, noise=(0.01, 0.02), prior=pr).optimum(TABLE).freq_mhz
                    ok[name] += e[best] / min(e.values()) - 1 <= 0.002
                n += 1
    return ok["alone"] / n, ok["prior"] / n, n
