"""Governor helpers only the tests use: leave-one-workload-out cross-validation, and workloads on the twin.

The product cross-validates through `dvfs_mlops.model.governor.search.cross_validate` with a split it chooses
(workload, task or model); the tests pin its arithmetic on the simplest split, one workload held out at a time.

`twin_curves` builds workloads from synthetic transformer-like step traces on a built-in twin profile (no torch): the
twin's expected curve, and, where asked, the measured draws with the twin's own seeded run-to-run noise
(`SimDevice.session(freq, label="<workload>#<repeat>")`, as a sweep point draws them and
benchmarks/governor_quality.py builds the paper preset).
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.profiles import builtin_profile
from dvfs_mlops.hw.twin.trace import KIND_KERNEL, KIND_VIEW, StepTrace
from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.governor.search import CVScore, Fitter, cross_validate
from dvfs_mlops.model.workload import WorkloadFeatures

# (layers, hidden): a size ladder from launch-bound to compute-bound steps
SIZES = [(2, 128), (4, 256), (4, 512), (6, 512), (8, 768), (12, 768), (12, 1024), (16, 1024), (24, 1024), (24, 1536),
         (32, 2048), (36, 2560)]
SEQUENCES = ((64, "short"), (128, "mid"), (256, "long"))  # (sequence length, the task it stands for)


def loocv(curves: Sequence[WorkloadCurve], objective: Objective, fit: Fitter) -> CVScore:
    """Leave-one-workload-out: fit on the others, choose for the held-out one."""
    return cross_validate(curves, objective, fit, "workload")


def synthetic_trace(layers: int, hidden: int, seq: int) -> StepTrace:
    """A transformer-like step: per layer 4 matmuls (FLOPs by formula) and 4 elementwise kernels, plus view ops."""
    tokens = 8 * seq
    kinds, flops, moved, formula = [], [], [], []
    for _ in range(3 * layers):  # forward, backward (x2)
        for _ in range(4):
            kinds.append(KIND_KERNEL), flops.append(2.0 * tokens * hidden * hidden), formula.append(True)
            moved.append(4.0 * (2 * tokens * hidden + hidden * hidden))
        for _ in range(4):
            kinds.append(KIND_KERNEL), flops.append(float(tokens * hidden)), formula.append(False)
            moved.append(8.0 * tokens * hidden)
        kinds.append(KIND_VIEW), flops.append(0.0), moved.append(0.0), formula.append(False)
    params = layers * 12 * hidden * hidden
    kinds.append(KIND_KERNEL), flops.append(12.0 * params), moved.append(28.0 * params), formula.append(False)
    return StepTrace(f"synthetic-{layers}-{hidden}-{seq}", np.asarray(kinds, dtype=np.int8), np.asarray(flops), np.asarray(moved),
                     np.asarray(formula, dtype=bool), params, 8, seq, "float32")


def twin_curves(profile: str, measured: bool = False, repeats: int = 1, seed: int = 0,
                sizes: Sequence[tuple[int, int]] = SIZES) -> list[WorkloadCurve]:
    """Every size at three sequence lengths on the profile's twin; every third size is an eval workload.

    Args:
        profile: a built-in twin profile.
        measured: the measured curves are the twin's noisy draws (the mean of `repeats`, each seeded by the workload
            and the repeat, as a sweep's); else they are the expected curve itself.
        repeats: draws per clock where `measured`.
        seed: the twin's noise seed.
        sizes: the (layers, hidden) of the models.

    Returns:
        The workloads, each with its expected curve (`energy_expected_j`, ...) and GPU utilisation by clock.
    """
    dev = SimDevice(builtin_profile(profile), seed=seed)
    out = []
    for i, (layers, hidden) in enumerate(sizes):
        for seq, task in SEQUENCES:
            curve, maxn = dev.curve(synthetic_trace(layers, hidden, seq))
            e = {f: s.energy_j for f, s in curve.items()}
            t = {f: s.time_s for f, s in curve.items()}
            workload = f"m{layers}x{hidden}/{task}"
            e_meas, t_meas, maxn_e, maxn_t = dict(e), dict(t), maxn.energy_j, maxn.time_s
            if measured:
                draws = [{f: dev.session(f, label=f"{workload}#{r}") for f in e} for r in range(repeats)]
                e_meas = {f: statistics.mean(e[f] * d[f].time_factor * d[f].power_factor for d in draws) for f in e}
                t_meas = {f: statistics.mean(t[f] * d[f].time_factor for d in draws) for f in e}
                at_maxn = [dev.session(MAXN, label=f"{workload}#{r}") for r in range(repeats)]
                maxn_e = statistics.mean(maxn.energy_j * s.time_factor * s.power_factor for s in at_maxn)
                maxn_t = statistics.mean(maxn.time_s * s.time_factor for s in at_maxn)
            feats = WorkloadFeatures("encoder", layers, hidden, layers * 12 * hidden * hidden, float(seq), 100.0 * maxn.gpu_util)
            split = "eval" if i % 3 == 1 else "train"
            out.append(WorkloadCurve(workload, split, feats, e_meas, t_meas, maxn_e, maxn_t, {}, dict(e), dict(t),
                                     maxn.energy_j, maxn.time_s, {f: 100.0 * s.gpu_util for f, s in curve.items()}))
    return out
