"""The twin with CPU and memory clocks, fitted to a real grid: BoFL's Jetson AGX Xavier training measurements (REAL data;
the fitted twin's figures are SIMULATED).

benchmarks/data/public/bofl-agx-xavier.csv holds every GPU x CPU x EMC setting (14 x 29 x 6) of three training
workloads, energy summed over the GPU, CPU, DDR and SYS5V rails (its README). It has no step traces, so each workload
is fitted as a `StepWork` (its host, GPU compute and DRAM work, and how they overlap) together with the board's
constants (hw/twin/fit.py `fit_grid`), on a seeded random 15 % of the settings; the other 85 % judge it. Reported:

- the energy error |E_twin / E_grid - 1| on the judged settings: mean and max, overall, per workload, and per domain
  (which clocks the setting moves off the grid's top: gpu, cpu, emc, gpu+cpu, ...), with time and power beside it;
- per workload, the twin's energy-optimal setting judged on the grid (its regret: E_grid(twin's pick) / E_grid(grid's
  optimum) - 1) and the saving each predicts against the top setting, jointly and on the GPU-only slice;
- where the form cannot follow the grid: its time along the EMC axis at the top GPU and CPU clocks (the grid's
  1333, 1600 and 1866 MHz take the same time, 2133 MHz is faster; DRAM bandwidth in proportion to the EMC clock cannot
  make a plateau);
- the built-in Orin twins with their CPU and EMC tables (SIMULATED): per model, the saving of the GPU-only and of the
  joint optimum against every clock at its top, on the energy a joint comparison uses on that board (`joint_energy`:
  AGX Orin VDD_GPU_SOC + VDD_CPU_CV + VDDQ_VDD2_1V8AO; Orin NX the module input VDD_IN, which every power term feeds).

    python -m benchmarks.twin_joint           # fit, print the table (and whether the shipped files match the fit)
    python -m benchmarks.twin_joint --write   # fit and rewrite benchmarks/data/twin-bofl-agx-xavier{,-work}.yaml
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
GRID = DATA / "public" / "bofl-agx-xavier.csv"
BOARD_FILE = DATA / "twin-bofl-agx-xavier.yaml"
WORK_FILE = DATA / "twin-bofl-agx-xavier-work.yaml"
PROFILE = "twin-bofl-agx-xavier"
FAMILY = "jetson-agx-xavier"
SEED = 0
# What the grid cannot tell and the Jetson AGX Xavier's data sheet does (NVIDIA Jetson AGX Xavier Series data sheet,
# DS-09654: 512-core Volta GPU with 64 Tensor Cores; 256-bit LPDDR4x, 137 GB/s at its 2133 MHz EMC clock). Every
# other constant is fitted or unused by a `StepWork`.
XAVIER_FACTS = {"cuda_cores": 512, "dram_bw_bytes_s": 136.5e9}


def xavier_base() -> Any:
    """The sim-orin constants with the Xavier's published facts: what `fit_grid` starts from."""
    from dvfs_mlops.hw.twin.params import OrinTwinParams

    return dataclasses.replace(OrinTwinParams(), **XAVIER_FACTS)


@dataclasses.dataclass(frozen=True)
class Optimum:
    """One workload: the twin's energy-optimal setting judged on the grid, jointly and on the GPU-only slice."""

    workload: str
    grid_best: Any  # Setting
    twin_best: Any
    regret: float  # E_grid(twin_best) / E_grid(grid_best) - 1
    saving_grid: float  # 1 - E_grid(grid_best) / E_grid(top)
    saving_twin: float  # 1 - E_twin(twin_best) / E_twin(top)
    gpu_regret: float  # the same on the GPU-only slice (CPU and EMC at the top)
    gpu_saving_grid: float
    gpu_saving_twin: float


def optima(grid: Any, fit: Any) -> list[Optimum]:
    """Per workload, the twin's and the grid's optimum over every setting and over the GPU-only slice."""
    import numpy as np

    from dvfs_mlops.hw.twin.fit import grid_settings
    from dvfs_mlops.hw.twin.physics import work_grid

    settings = grid_settings(grid)
    top = grid.top
    gpu_only = [i for i, s in enumerate(settings) if s.cpu_mhz == top.cpu_mhz and s.emc_mhz == top.emc_mhz]
    clocks = [np.array([getattr(s, c) for s in settings], dtype=float) for c in ("gpu_mhz", "cpu_mhz", "emc_mhz")]
    i_top = settings.index(top)
    out = []
    for w in fit.work:
        measured = np.array([grid.mean(w.key, s).energy_j for s in settings])
        twin = work_grid(w, *clocks, fit.params).energy_total_j

        g, t = _argmins(measured, twin, list(range(len(settings))))
        gg, gt = _argmins(measured, twin, gpu_only)
        out.append(Optimum(w.key, settings[g], settings[t], measured[t] / measured[g] - 1, 1 - measured[g] / measured[i_top],
                           1 - twin[t] / twin[i_top], measured[gt] / measured[gg] - 1, 1 - measured[gg] / measured[i_top],
                           1 - twin[gt] / twin[i_top]))
    return out


def _argmins(measured: Any, twin: Any, idx: list[int]) -> tuple[int, int]:
    """The indices (among `idx`) of the grid's and the twin's lowest energy."""
    import numpy as np

    return idx[int(np.argmin(measured[idx]))], idx[int(np.argmin(twin[idx]))]


def emc_axis(grid: Any, fit: Any) -> list[tuple[str, float, float, float]]:
    """Per workload and EMC clock at the top GPU and CPU clocks: (workload, EMC MHz, grid time, twin time)."""
    from dvfs_mlops.clocks import Setting
    from dvfs_mlops.hw.twin.physics import estimate_work

    top = grid.top
    rows = []
    for w in fit.work:
        for emc in grid.emc_mhz:
            s = Setting(top.gpu_mhz, top.cpu_mhz, emc)
            rows.append((w.key, emc, grid.mean(w.key, s).time_s, estimate_work(w, s, fit.params).time_s))
    return rows


ORIN_TWINS = ("sim-orin-measured", "sim-orin-nx-16gb")
ORIN_MODELS = ("bert-tiny", "bert-base", "bert-large")


@dataclasses.dataclass(frozen=True)
class Headroom:
    """One model on one Orin twin: the GPU-only and the joint optimum against every clock at its top."""

    profile: str
    model: str
    energy: str  # the rails summed
    gpu_only_saving: float
    joint_saving: float
    joint_pick: Any  # Setting


def orin_headroom(profile: str, model: str) -> Headroom:
    """Every (GPU, CPU, EMC) setting of a built-in twin's tables for one model (batch 16, SST-2's mean length)."""
    import itertools

    from dvfs_mlops.clocks import Setting
    from dvfs_mlops.hw.twin.physics import RAILS, estimate_step, joint_energy
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.workloads.tasks import TASKS
    from dvfs_mlops.job.workloads.zoo import PRESETS

    p = builtin_profile(profile)
    trace = TraceCache().get(PRESETS[model].config(), 16, TASKS["sst2"].mean_tokens)
    agx = p.family.startswith("jetson-agx-orin")
    rails = joint_energy(RAILS).rails if agx else RAILS  # Orin NX / Nano: VDD_IN holds every term
    energy = {}
    for s in itertools.starmap(Setting, itertools.product(p.frequencies_mhz, p.cpu_frequencies_mhz, p.emc_frequencies_mhz)):
        est = estimate_step(trace, s, p)
        energy[s] = sum(est.power_by_rail_w[r] for r in rails) * est.time_s
    top = energy[Setting(p.max_mhz, p.cpu_max_mhz, p.emc_max_mhz)]
    gpu_only = min(e for s, e in energy.items() if s.cpu_mhz == p.cpu_max_mhz and s.emc_mhz == p.emc_max_mhz)
    pick = min(energy, key=energy.__getitem__)
    return Headroom(profile, model, " + ".join(rails) if agx else "VDD_IN (every term)", 1 - gpu_only / top, 1 - energy[pick] / top, pick)


def fit_bofl() -> tuple[Any, Any, float]:
    """Read the grid and fit it; returns (grid, fit, seconds the fit took)."""
    from dvfs_mlops.hw.replay import read_grid
    from dvfs_mlops.hw.twin.fit import fit_grid

    grid = read_grid(GRID)
    t0 = time.perf_counter()
    fit = fit_grid(grid, xavier_base(), PROFILE, FAMILY, seed=SEED)
    return grid, fit, time.perf_counter() - t0


def header(fit: Any) -> str:
    """The comment block both files start with."""
    e = fit.judged.overall["energy"]
    return (f"SIMULATED twin of a Jetson AGX Xavier, fitted by `python -m benchmarks.twin_joint --write` (hw/twin/fit.py fit_grid)\n"
            f"to REAL measurements: {fit.source[0]} (sha256 {fit.source[1]}; BoFL, H. Guo et al., Middleware 2022,\n"
            "github.com/hongpeng-guo/BoFL @c89944d5; benchmarks/data/public/README.md), energy = GPU + CPU + DDR + SYS5V rails.\n"
            f"Fitted on {len(fit.split.fitted)} settings (a seeded {fit.split.share:.0%} of the grid's), judged on the other "
            f"{len(fit.split.judged)}:\n"
            f"energy error per (workload, setting) on those: mean {e.mean:.2%}, max {e.max:.2%} (per workload and domain: the work file).\n"
            "The grid's energy sums every rail, so its constant power cannot be split among them: it is all in gpu_static_w\n"
            "(sys_5v0_w 0; the CPU and DDR rails hold only the parts that follow their clocks: cpu_clock_share = ddr_clock_share = 1).\n"
            "Only the shapes of V(f) and k V^2 are observable (top voltages are sim-orin's). cuda_cores and dram_bw_bytes_s: the\n"
            "Xavier data sheet's. Load the board with `--twin-params` / load_twin_params(None, path); the workloads' StepWork with\n"
            "hw/twin/fit.py load_grid_work.")


def run(write: bool = False) -> list[tuple[str, str, str]]:
    """Fit the BoFL grid; the benchmark's rows (metric, value, target). `write` rewrites the shipped YAML files."""
    from dvfs_mlops.hw.twin.fit import load_grid_work, save_grid_fit

    grid, fit, seconds = fit_bofl()
    if write:
        save_grid_fit(fit, BOARD_FILE, WORK_FILE, header(fit))
    rows: list[tuple[str, str, str]] = []
    e = fit.judged.overall
    rows.append(("judged settings: energy error mean / max (SIMULATED vs REAL)",
                 f"{e['energy'].mean:.2%} / {e['energy'].max:.2%} ({fit.judged.n} workload-settings)", "report"))
    rows.append(("judged settings: time error mean / max", f"{e['time'].mean:.2%} / {e['time'].max:.2%}", "report"))
    rows.append(("judged settings: power error mean / max", f"{e['power'].mean:.2%} / {e['power'].max:.2%}", "report"))
    f = fit.fitted_errors.overall["energy"]
    rows.append(("fitted settings: energy error mean / max", f"{f.mean:.2%} / {f.max:.2%} ({fit.fitted_errors.n})", "report"))
    for w, errs in fit.judged.by_workload.items():
        rows.append((f"{w}: energy error mean / max (judged)", f"{errs['energy'].mean:.2%} / {errs['energy'].max:.2%}", "report"))
    for d, errs in fit.judged.by_domain.items():
        rows.append((f"domain {d}: energy error mean / max (judged)", f"{errs['energy'].mean:.2%} / {errs['energy'].max:.2%}",
                     "report"))
    for o in optima(grid, fit):
        rows.append((f"{o.workload}: joint optimum grid / twin's pick (GPU/CPU/EMC MHz)",
                     f"{o.grid_best.label()} / {o.twin_best.label()}; regret {o.regret:.2%}", "report"))
        rows.append((f"{o.workload}: saving vs top, grid / twin (joint; GPU-only)",
                     (f"{o.saving_grid:.1%} / {o.saving_twin:.1%}; {o.gpu_saving_grid:.1%} / {o.gpu_saving_twin:.1%} "
                      f"(GPU-only pick regret {o.gpu_regret:.2%})"), "report"))
    for w, emc, t_grid, t_twin in emc_axis(grid, fit):
        rows.append((f"{w}: step time at EMC {emc:g} MHz (top GPU, CPU), grid / twin", f"{t_grid * 1e3:.1f} / {t_twin * 1e3:.1f} ms",
                     "report"))
    for profile in ORIN_TWINS:
        for model in ORIN_MODELS:
            h = orin_headroom(profile, model)
            rows.append((f"{profile} {model}: saving vs top, GPU-only / joint (SIMULATED; {h.energy})",
                         f"{h.gpu_only_saving:.1%} / {h.joint_saving:.1%} at {h.joint_pick.label()}", "report"))
    p = fit.params
    rows.append(("fitted host: CPU-bound share, CPU clock taken by other work",
                 f"{p.cpu_bound_share:.3f}, {p.cpu_reserved_mhz:.1f} MHz", "report"))
    rows.append(("fit time (s)", f"{seconds:.1f}", "report"))
    if not write:
        rows.append(("shipped files match this fit", str(_shipped_match(fit, load_grid_work)), "True"))
    return rows


def _shipped_match(fit: Any, load_grid_work: Any) -> bool:
    """Whether the shipped work file holds this fit's work and judged errors (to 1e-9)."""
    import math

    if not WORK_FILE.exists():
        return False
    shipped = load_grid_work(WORK_FILE)
    same_work = all(math.isclose(getattr(a, k), getattr(b, k), rel_tol=1e-9) for a, b in zip(shipped.work, fit.work)
                    for k in ("host_serial_s", "host_dispatch_s", "gpu_compute_s", "dram_bytes", "kernel_overlap", "queue_overlap"))
    e = shipped.errors_judged["overall"]["energy"]
    return same_work and math.isclose(e["mean_rel"], fit.judged.overall["energy"].mean, rel_tol=1e-9)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the fitted board and work files under benchmarks/data/")
    args = parser.parse_args(argv)
    print("| metric | value | target |\n|---|---|---|")
    for m, v, t in run(write=args.write):
        print(f"| {m} | {v} | {t} |")
    if args.write:
        print(f"wrote {BOARD_FILE} and {WORK_FILE}")


if __name__ == "__main__":
    main(sys.argv[1:])
