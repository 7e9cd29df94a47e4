"""The twin's calibration targets (DESIGN §4), computed in one place for tests and benchmarks.

It runs the twin (`twin/`) on the model presets (`workloads/`), so it sits above both: the twin
itself knows nothing of the presets.

Workloads are the study's: every model preset on the characterisation tasks' length profiles
(sst2, qnli, mrpc mean token counts), batch 16, FP32. `check()` returns the failed targets by name,
so a test failure says which one broke and by how much.

Targets come in two kinds. The board's physics must hold on every profile: energy U-shaped with
its minimum inside the table, at least four distinct optima, deeper models optimal at higher
clocks, the compute-bound time ratio, bert-large's power at maxn. The study's results
(`STUDY_TARGETS`: big models' optima within 510-1020 MHz, the savings against maxn, maxn never
dearer than pinned 1300.5) are what sim-orin was shaped after; a profile not fitted to the study
(sim-orin-measured) need not reproduce them: `check(study=False)` leaves them out.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
from collections.abc import Iterator
from typing import Any

import numpy as np

from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.hw.twin.physics import energy_curve, estimate_maxn
from dvfs_mlops.hw.twin.trace import TraceCache, trace_key
from dvfs_mlops.job.workloads.tasks import TASKS
from dvfs_mlops.job.workloads.zoo import PRESETS
from dvfs_mlops.model.workload import SMALL_MODEL_PARAMS

CHARACTERISATION_TASKS = ("sst2", "qnli", "mrpc")
# The targets sim-orin's power constants were searched for (the study's results, not the board's physics).
STUDY_TARGETS = ("big_optimum", "saving_big", "saving_small", "maxn_le_pinned")


@dataclasses.dataclass(frozen=True)
class WorkloadPoint:
    model: str
    task: str
    num_layers: int
    num_params: int
    optimal_mhz: float
    saving_vs_maxn: float  # 1 - E(opt)/E(maxn)
    maxn_mhz: float
    energy_by_freq_j: dict[float, float]
    maxn_energy_j: float
    pinned_max_energy_j: float


@dataclasses.dataclass(frozen=True)
class CalibrationReport:
    points: list[WorkloadPoint]
    compute_bound_time_ratio: float  # t(306)/t(1300.5), bert-large b32 s128
    bert_large_maxn_power_w: float  # total rails, bert-large b32 s128
    frequencies_mhz: tuple[float, ...] = OrinTwinParams().frequencies_mhz  # the profile's table

    def _mean(self, pts: list[WorkloadPoint], attr: str) -> float:
        return float(np.mean([getattr(p, attr) for p in pts])) if pts else float("nan")

    @property
    def big(self) -> list[WorkloadPoint]:
        return [p for p in self.points if p.num_params > SMALL_MODEL_PARAMS]

    @property
    def small(self) -> list[WorkloadPoint]:
        return [p for p in self.points if p.num_params <= SMALL_MODEL_PARAMS]

    def summary(self) -> dict[str, Any]:
        deep = [p.optimal_mhz for p in self.points if p.num_layers > 7]
        shallow = [p.optimal_mhz for p in self.points if p.num_layers <= 7]
        return {
            "workloads": len(self.points),
            "distinct_optima_mhz": sorted({p.optimal_mhz for p in self.points}),
            "mean_opt_deep_mhz": float(np.mean(deep)),
            "mean_opt_shallow_mhz": float(np.mean(shallow)),
            "saving_big_mean": self._mean(self.big, "saving_vs_maxn"),
            "saving_small_mean": self._mean(self.small, "saving_vs_maxn"),
            "big_optima_mhz": sorted({p.optimal_mhz for p in self.big}),
            "compute_bound_time_ratio": self.compute_bound_time_ratio,
            "bert_large_maxn_power_w": self.bert_large_maxn_power_w,
        }

    def check(self, study: bool = True) -> dict[str, str]:
        """Failed targets: name -> what was found. Empty when every target holds. `study=False`: the board's
        physics only, without `STUDY_TARGETS`."""
        failed = self._check()
        if not study:
            failed = {k: v for k, v in failed.items() if k.split(":")[0] not in STUDY_TARGETS}
        return failed

    def _check(self) -> dict[str, str]:
        s = self.summary()
        failed: dict[str, str] = {}
        lo, hi = min(self.frequencies_mhz), max(self.frequencies_mhz)
        for p in self.points:
            curve = p.energy_by_freq_j
            if p.optimal_mhz in (lo, hi):
                failed[f"u_shape:{p.model}/{p.task}"] = f"optimum at the table edge {p.optimal_mhz}"
            if p.num_params > SMALL_MODEL_PARAMS and not 510 <= p.optimal_mhz <= 1020:
                failed[f"big_optimum:{p.model}/{p.task}"] = f"{p.optimal_mhz} MHz outside 510-1020"
            if p.maxn_energy_j > p.pinned_max_energy_j * (1 + 1e-9):
                failed[f"maxn_le_pinned:{p.model}/{p.task}"] = f"{p.maxn_energy_j:.4g} J > {p.pinned_max_energy_j:.4g} J"
            if curve[p.optimal_mhz] > min(curve.values()) + 1e-12:
                failed[f"argmin:{p.model}/{p.task}"] = "optimal clock is not the curve's minimum"
        if len(s["distinct_optima_mhz"]) < 4:
            failed["distinct_optima"] = f"{s['distinct_optima_mhz']} (need >= 4)"
        if not s["mean_opt_deep_mhz"] > s["mean_opt_shallow_mhz"]:
            failed["deeper_runs_faster"] = f"deep {s['mean_opt_deep_mhz']:.0f} <= shallow {s['mean_opt_shallow_mhz']:.0f}"
        if not 0.15 <= s["saving_big_mean"] <= 0.30:
            failed["saving_big"] = f"{s['saving_big_mean']:.3f} not in 0.15-0.30"
        if not 0.0 <= s["saving_small_mean"] <= 0.20 or not s["saving_small_mean"] < s["saving_big_mean"]:
            failed["saving_small"] = f"{s['saving_small_mean']:.3f} not in 0-0.20 or not below big {s['saving_big_mean']:.3f}"
        if not 3.0 <= s["compute_bound_time_ratio"] <= 4.0:
            failed["compute_bound_ratio"] = f"{s['compute_bound_time_ratio']:.2f} not in 3.0-4.0"
        if not 45 <= s["bert_large_maxn_power_w"] <= 65:
            failed["bert_large_power"] = f"{s['bert_large_maxn_power_w']:.1f} W not in 45-65"
        return failed


@contextlib.contextmanager
def _capture_lock(cache: TraceCache, key: str, wait: bool) -> Iterator[bool]:
    """The lock of one trace's capture in `cache`'s folder (flock: released when the process ends): True where held."""
    cache.directory.mkdir(parents=True, exist_ok=True)
    with open(cache.directory / f"{key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def fill_traces(cache: TraceCache, shapes: list[tuple[Any, int, int]]) -> None:
    """Capture the traces of `shapes` (config, batch, length) into `cache`, sharing the work with any other process
    filling the same folder at the same time: each takes the traces nobody is capturing, then waits for the others'
    (so two test workers calibrating at once capture each trace once, in half the time, instead of each all of them)."""
    keys = [trace_key(config, batch, seq, "float32", 2) for config, batch, seq in shapes]
    busy = []
    for key, shape in zip(keys, shapes):
        with _capture_lock(cache, key, wait=False) as held:
            if held:
                cache.get(*shape)
            else:
                busy.append((key, shape))
    for key, shape in busy:
        with _capture_lock(cache, key, wait=True):
            cache.get(*shape)  # the other process's file, written whole before its lock was let go


def calibrate(params: OrinTwinParams | None = None, cache: TraceCache | None = None, batch_size: int = 16) -> CalibrationReport:
    """Run the twin over the study's workloads and collect what the targets need."""
    p = params or OrinTwinParams()
    cache = cache or TraceCache()
    configs = {name: preset.config() for name, preset in PRESETS.items()}
    fill_traces(cache, [(configs[name], batch_size, TASKS[task].mean_tokens) for name in PRESETS for task in CHARACTERISATION_TASKS]
                + [(configs["bert-large"], 32, 128)])
    points: list[WorkloadPoint] = []
    for name, preset in PRESETS.items():
        config = configs[name]
        for task in CHARACTERISATION_TASKS:
            trace = cache.get(config, batch_size, TASKS[task].mean_tokens)
            curve = energy_curve(trace, p)
            maxn = estimate_maxn(trace, p, curve)
            energies = {f: e.energy_j for f, e in curve.items()}
            opt = min(energies, key=energies.__getitem__)
            points.append(
                WorkloadPoint(
                    model=name,
                    task=task,
                    num_layers=preset.num_layers,
                    num_params=trace.num_params,
                    optimal_mhz=opt,
                    saving_vs_maxn=1.0 - energies[opt] / maxn.energy_j,
                    maxn_mhz=maxn.settled_mhz,
                    energy_by_freq_j=energies,
                    maxn_energy_j=maxn.energy_j,
                    pinned_max_energy_j=energies[p.max_mhz],
                )
            )
    big = cache.get(configs["bert-large"], 32, 128)
    big_curve = energy_curve(big, p)
    ratio = big_curve[min(p.frequencies_mhz)].time_s / big_curve[p.max_mhz].time_s
    power = estimate_maxn(big, p, big_curve).avg_power_w
    return CalibrationReport(points, ratio, power, tuple(sorted(p.frequencies_mhz)))
