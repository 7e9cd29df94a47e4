"""Measuring less on the twin (SIMULATED): the curve model from 4 clocks, refine, the adaptive sweep.

Workloads: the paper preset's held-out (eval-split) tasks x every model preset, batch 16, each task's
mean length. Regret is against the twin's EXPECTED (noise-free) energy curve; measurements are noisy
draws with the twin's noise (one draw per clock or probe window), 50 independent draws per workload (with 5, the
adaptive share's standard error is about 1.1 points, as large as its distance to the target).
"""
from __future__ import annotations

import numpy as np

FOUR = (306.0, 612.0, 918.0, 1300.5)


def _workloads(params):
    from dvfs_mlops.twin.physics import energy_curve
    from dvfs_mlops.twin.trace import TraceCache
    from dvfs_mlops.workloads.tasks import TASKS
    from dvfs_mlops.workloads.zoo import PRESETS

    cache = TraceCache()
    for name, preset in PRESETS.items():
        for task, spec in TASKS.items():
            if spec.split == "eval":
                yield f"{name}/{task}", energy_curve(cache.get(preset.config(), 16, spec.mean_tokens), params)


def run() -> list[tuple[str, str, str]]:
    """Every built-in twin profile (DVFS_BENCH_TWIN_PROFILES narrows it, or names a YAML), one block of rows each."""
    import os

    names = os.environ.get("DVFS_BENCH_TWIN_PROFILES", "sim-orin,sim-orin-measured").split(",")
    return [row for name in names for row in run_profile(name.strip())]


def run_profile(profile: str = "sim-orin", repeats: int = 50, job_steps: int = 600, budget: int = 30) -> list[tuple[str, str, str]]:
    from dvfs_mlops.curve import Measurement, fit_curve, next_clock, voltage_shape_for
    from dvfs_mlops.device.sim import SimDevice
    from dvfs_mlops.refine import WARMUP_STEPS, plan
    from dvfs_mlops.twin.params import OrinTwinParams
    from dvfs_mlops.twin.profiles import BUILTIN_PROFILES

    p = BUILTIN_PROFILES[profile] if profile in BUILTIN_PROFILES else OrinTwinParams.from_yaml(profile)
    rng = np.random.default_rng(0)
    table = sorted(p.frequencies_mhz)
    shape = voltage_shape_for(SimDevice(p))  # the profile's own voltage curve, as the sweep and refine use it

    def draw(est) -> Measurement:
        tf, pf = 1 + p.noise_time * rng.standard_normal(), 1 + p.noise_power * rng.standard_normal()
        return Measurement(est.freq_mhz, est.time_s * tf, est.energy_j * tf * pf)

    err, reg4, reg11, reg_ref, breakeven, ad_ok, ad_clocks = [], [], [], [], [], [], []
    for _, curve in _workloads(p):
        e = {f: s.energy_j for f, s in curve.items()}
        emin = min(e.values())
        for _ in range(repeats):
            meas = {f: draw(curve[f]) for f in table}
            fit = fit_curve([meas[f] for f in FOUR], voltage_shape=shape, f_max_mhz=table[-1])
            err += [abs(pt.energy_j / e[pt.freq_mhz] - 1) for pt in fit.predict(table) if pt.freq_mhz not in FOUR]
            reg4.append(e[fit.optimum(table).freq_mhz] / emin - 1)
            reg11.append(e[min(meas, key=lambda f: meas[f].energy_j)] / emin - 1)
            # (b) refine from the middle of the table (no governor): probes + the rest at the choice
            start = table[len(table) // 2]
            clocks, per = plan(budget, start, table)
            probes = [draw(curve[f]) for f in clocks]
            chosen = fit_curve(probes, voltage_shape=shape, f_max_mhz=table[-1]).optimum(table).freq_mhz
            probe_j = sum(per * e[f] for f in clocks)
            total = WARMUP_STEPS * e[start] + probe_j + (job_steps - WARMUP_STEPS - per * len(clocks)) * e[chosen]
            reg_ref.append(total / (job_steps * emin) - 1)
            # break-even: job length where refine beats staying at the start clock (expected values)
            extra = probe_j - per * len(clocks) * e[chosen]
            gain = e[start] - e[chosen]
            breakeven.append(WARMUP_STEPS + per * len(clocks) + extra / gain if gain > 0 else float("inf"))
            # (c) adaptive
            got: list[Measurement] = []
            while (f := next_clock(got, table, start, voltage_shape=shape)) is not None:
                got.append(draw(curve[f]))
            ad_clocks.append(len(got))
            ad_ok.append(e[fit_curve(got, voltage_shape=shape, f_max_mhz=table[-1]).optimum(table).freq_mhz] / emin - 1 <= 0.002)
    finite = [b for b in breakeven if np.isfinite(b)]
    pct = lambda xs: f"{100 * float(np.mean(xs)):.3f} %"
    return [
        (f"[{profile}] (a) curve model, 4 clocks: mean energy error on the other 7 clocks", pct(err), "<= 3 %"),
        (f"[{profile}] (a) regret of the fitted argmin", pct(reg4), "~0.05 %"),
        (f"[{profile}] (a) regret of the argmin of 11 measured clocks (reference)", pct(reg11), "-"),
        (f"[{profile}] (b) refine {budget} probe steps, {job_steps}-step job, regret incl. probes (start 816)", pct(reg_ref), "<= 0.2 %"),
        (f"[{profile}] (b) break-even job length vs staying at the start (median, where refine gains)",
         f"{float(np.median(finite)):.0f} steps" if finite else "n/a", "-"),
        (f"[{profile}] (c) adaptive: pinned clocks per workload (+ maxn)", f"{np.mean(ad_clocks):.2f}", "<= 4"),
        (f"[{profile}] (c) adaptive: share within 0.2 % of the expected optimum ({len(ad_ok)} draws, +- one standard error)",
         f"{100 * np.mean(ad_ok):.1f} % +- {100 * float(np.sqrt(np.mean(ad_ok) * (1 - np.mean(ad_ok)) / len(ad_ok))):.1f}", ">= 95 %"),
    ]
