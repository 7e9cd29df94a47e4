"""Measuring less on the twin (SIMULATED): the curve model from 4 clocks, refine, the adaptive sweep.

Workloads: the paper preset's held-out (eval-split) workloads, 12 models x 6 tasks, as the governor
benchmark builds them (`governor_quality.paper_curves`: batch 16, each workload's median padded length).
Regret is against the twin's EXPECTED (noise-free) energy curve; measurements are noisy draws with the
twin's noise (one draw per clock or probe window), 50 independent draws per workload (with 5, the
adaptive share's standard error is about 1.1 points, as large as its distance to the target); the
adaptive sweep as the product runs it, whose next_clock leans on the prior of every workload measured
before (a board-prior fit per workload per draw), on the first 20 (DVFS_BENCH_ADAPTIVE_PRIOR_DRAWS).

Refine and the adaptive sweep start where the product starts them: at the production governor's
choice for the workload. The governor is trained here as `python -m benchmarks governor` trains it
(on the paper preset's 36 train-split workloads of the same profile, DVFS_BENCH_TRIALS trials, default
60) and never sees the eval workloads; refine runs with and without the power prior that `train` stores
on the governor's version (from the same 36 train-split workloads' clocks and GPU utilisation), as
`finetune --refine` uses it. Robustness rows start refine from the middle of the table (no
governor) and from two table steps off the optimum (below it where the table allows, else above).

usage: python -m benchmarks measure_less   (DVFS_BENCH_TWIN_PROFILES, default sim-orin,sim-orin-measured, any built-in
profiles; DVFS_BENCH_TRIALS, default 60; DVFS_BENCH_MEASURE_DRAWS, default 50; DVFS_BENCH_ADAPTIVE_PRIOR_DRAWS, default 20)
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np


def run() -> list[tuple[str, str, str]]:
    """sim-orin and sim-orin-measured, or the built-in profiles DVFS_BENCH_TWIN_PROFILES names, one block of rows each;
    DVFS_BENCH_MEASURE_DRAWS draws per workload (default 50)."""
    names = [n.strip() for n in os.environ.get("DVFS_BENCH_TWIN_PROFILES", "sim-orin,sim-orin-measured").split(",") if n.strip()]
    draws = int(os.environ.get("DVFS_BENCH_MEASURE_DRAWS", "50"))
    return [row for name in names for row in run_profile(name, repeats=draws)]


def _governor_starts(profile: str) -> tuple[list[float], list[dict[float, float]], list[dict[float, float]], list[dict[float, float]],
                                            list[float], Any]:
    """(clock table, eval workloads' expected per-step energy, time and GPU utilisation (0..1), the production governor's
    choice for each, the power prior its version would carry: `train`'s, from the train-split workloads only)."""
    from benchmarks.governor_quality import paper_dataset
    from dvfs_mlops.model.governor.dataset import board_power_prior
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import run_search

    ds = paper_dataset(profile)
    freqs = ds.frequencies
    trials = int(os.environ.get("DVFS_BENCH_TRIALS", "60"))
    gov = run_search(ds, parse_objective("energy"), trials=trials, seed=0, storage="sqlite:///:memory:", outer_trials=1).policy
    evals = ds.split("eval").curves
    return (sorted(freqs), [dict(c.energy_expected_j) for c in evals], [dict(c.time_expected_s) for c in evals],
            [{f: u / 100.0 for f, u in c.gpu_util_pct.items()} for c in evals], [float(c.nearest(gov.choose(c.features, freqs))) for c in evals],
            board_power_prior(ds.split("train")))


def run_profile(profile: str = "sim-orin", repeats: int = 50, job_steps: int = 600, budget: int = 30) -> list[tuple[str, str, str]]:
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES
    from dvfs_mlops.job.refine import WARMUP_STEPS, ProbePlan
    from dvfs_mlops.model.curve import Measurement, fit_curve, next_clock
    from dvfs_mlops.model.governor.transfer import spread_clocks
    from dvfs_mlops.model.power_prior import board_prior, leave_one_out_priors

    p = BUILTIN_PROFILES[profile]
    rng = np.random.default_rng(0)
    table, energies, times, utils, gov, prior = _governor_starts(profile)
    dev = SimDevice(p)
    board = board_of(dev)
    shape, noise = board.voltage_shape, board.noise()  # the profile's own voltage curve and window noise, as refine uses them

    def draw(e: dict[float, float], t: dict[float, float], f: float, u: dict[float, float] | None = None) -> Measurement:
        tf, pf = 1 + p.noise_time * rng.standard_normal(), 1 + p.noise_power * rng.standard_normal()
        return Measurement(f, t[f] * tf, e[f] * tf * pf, None if u is None else u[f])

    starts = ("governor", "governor, with its power prior", "mid-table", "two off")
    four = spread_clocks(table, 4)  # 306/612/918/1300.5 on the AGX Orin 64 GB
    err, reg4, reg11, reg_gov = [], [], [], []
    reg_ref: dict[str, list[float]] = {s: [] for s in starts}
    steps_ref: dict[str, list[int]] = {s: [] for s in starts}
    cost_ref: dict[str, list[float]] = {s: [] for s in starts}  # probe cost above the settled clock, + warm-up, per unit of e_min
    gain_ref: dict[str, list[float]] = {s: [] for s in starts}  # per-step saving of the settled clock over the start
    # (c) the adaptive sweep, from the governor's clock (a sweep with a production governor) and from mid-table (a first
    # sweep), two ways: each workload's fit alone (every draw), and as the product runs it (the first `ad_repeats` draws:
    # next_clock leaning on the prior of the workloads measured before, predicted.csv on the leave-one-out prior)
    ad_starts, ad_repeats = ("governor", "mid-table"), min(repeats, int(os.environ.get("DVFS_BENCH_ADAPTIVE_PRIOR_DRAWS", "20")))
    ad_ok: dict[str, list[bool]] = {s: [] for s in ad_starts}
    ad_clocks: dict[str, list[int]] = {s: [] for s in ad_starts}
    prior_clocks: dict[str, list[int]] = {s: [] for s in ad_starts}
    # by start and draw, in workload order: a sweep of all eval workloads
    ad_sweeps: dict[str, list[list[tuple[list[Measurement], dict[float, float]]]]] = {s: [[] for _ in range(ad_repeats)] for s in ad_starts}
    for e, t, u, g in zip(energies, times, utils, gov):
        emin = min(e.values())
        iopt = table.index(min(e, key=e.__getitem__))
        first = {"governor": g, "governor, with its power prior": g, "mid-table": table[len(table) // 2],
                 "two off": table[iopt - 2 if iopt >= 2 else iopt + 2]}
        reg_gov.append(e[g] / emin - 1)
        for rep in range(repeats):
            meas = {f: draw(e, t, f) for f in table}
            fit = fit_curve([meas[f] for f in four], voltage_shape=shape, f_max_mhz=table[-1])
            err += [abs(pt.energy_j / e[pt.freq_mhz] - 1) for pt in fit.predict(table) if pt.freq_mhz not in four]
            reg4.append(e[fit.optimum(table).freq_mhz] / emin - 1)
            reg11.append(e[min(meas, key=lambda f: meas[f].energy_j)] / emin - 1)
            # (b) refine: the job's warm-up at the start, the probes (one draw each) and the rest at the settled clock
            for s in starts:
                leaning = prior if s == "governor, with its power prior" else None  # what `finetune --refine` uses
                plan = ProbePlan(first[s], table, budget, voltage_shape=shape, noise=noise, prior=leaning)
                probed = []
                while (f := plan.next_clock()) is not None:
                    plan.record(draw(e, t, f, u))
                    probed.append(f)
                chosen, per = plan.chosen_mhz, plan.per_probe
                ps, probe_j = per * len(probed), sum(per * e[f] for f in probed)
                total = WARMUP_STEPS * e[first[s]] + probe_j + (job_steps - WARMUP_STEPS - ps) * e[chosen]
                reg_ref[s].append(total / (job_steps * emin) - 1)
                steps_ref[s].append(ps)
                cost_ref[s].append((probe_j - ps * e[chosen]) / emin)
                gain_ref[s].append((e[first[s]] - e[chosen]) / emin)
            # (c) adaptive: from the governor's clock (a sweep with a production governor) and from mid-table (a first sweep)
            for s in ad_starts:
                got: list[Measurement] = []
                while (f := next_clock(got, table, first[s], voltage_shape=shape, noise=noise)) is not None:
                    got.append(draw(e, t, f, u))
                ad_clocks[s].append(len(got))
                ad_ok[s].append(e[fit_curve(got, voltage_shape=shape, f_max_mhz=table[-1]).optimum(table).freq_mhz] / emin - 1 <= 0.002)
                if rep < ad_repeats:
                    so_far = board_prior([m for m, _ in ad_sweeps[s][rep]], voltage_shape=shape, f_max_mhz=table[-1], noise=noise[1])
                    got = []
                    while (f := next_clock(got, table, first[s], voltage_shape=shape, noise=noise, prior=so_far)) is not None:
                        got.append(draw(e, t, f, u))
                    prior_clocks[s].append(len(got))
                    ad_sweeps[s][rep].append((got, e))
    # (c) as the sweep predicts once every workload is measured: each workload's power curve with the board prior of the others
    ad_prior_ok: dict[str, list[bool]] = {s: [] for s in ad_starts}
    for s, sweeps in ad_sweeps.items():
        for sweep in sweeps:
            priors = leave_one_out_priors([got for got, _ in sweep], voltage_shape=shape, f_max_mhz=table[-1], noise=noise[1])
            for (got, e), prior in zip(sweep, priors):
                best = fit_curve(got, voltage_shape=shape, f_max_mhz=table[-1], noise=noise, prior=prior).optimum(table).freq_mhz
                ad_prior_ok[s].append(e[best] / min(e.values()) - 1 <= 0.002)
    pct = lambda xs: f"{100 * float(np.mean(xs)):.3f} %"

    def breakeven(s: str) -> str:
        # the job length where refine's expected energy equals staying at the start, over all draws of all workloads
        gain = float(np.mean(gain_ref[s]))
        if gain <= 0:
            return "never (on average it settles no better than the start)"
        return f"{WARMUP_STEPS + float(np.mean(cost_ref[s])) / gain:.0f} steps"

    def share(xs: list[bool]) -> str:
        return f"{100 * np.mean(xs):.1f} % +- {100 * float(np.sqrt(np.mean(xs) * (1 - np.mean(xs)) / len(xs))):.1f}"

    rows = [
        (f"[{profile}] (a) curve model, 4 clocks: mean energy error on the other 7 clocks", pct(err), "<= 3 %"),
        (f"[{profile}] (a) regret of the fitted argmin", pct(reg4), "~0.05 %"),
        (f"[{profile}] (a) regret of the argmin of {len(table)} measured clocks (reference)", pct(reg11), "-"),
        (f"[{profile}] (b) the production governor alone (no probes): regret", pct(reg_gov), "-"),
    ]
    for s in starts:
        target = "<= 0.2 %" if s.startswith("governor") else "- (robustness)"
        what = (f"[{profile}] (b) refine {budget} probe steps, {job_steps}-step job, from {s}: regret incl. probes "
                f"(mean probe steps {np.mean(steps_ref[s]):.1f}); break-even vs staying at the start")
        rows.append((what, f"{pct(reg_ref[s])}; {breakeven(s)}", target))
    for s in ad_starts:
        what = (f"[{profile}] (c) adaptive from {s}, each workload's fit alone: pinned clocks per workload (+ maxn); share within 0.2 % "
                f"of the expected optimum ({len(ad_ok[s])} draws, +- one standard error)")
        rows.append((what, f"{np.mean(ad_clocks[s]):.2f}; {share(ad_ok[s])}", "-"))
        what = (f"[{profile}] (c) adaptive from {s} as the sweep runs it (next_clock with the prior of the workloads before, "
                f"predicted.csv with the others'): pinned clocks; share within 0.2 % ({len(ad_prior_ok[s])} draws)")
        rows.append((what, f"{np.mean(prior_clocks[s]):.2f}; {share(ad_prior_ok[s])}", "<= 4; >= 95 %"))
    return rows
