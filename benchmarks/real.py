"""Real measured grids, replayed (REPLAYED, not simulated): what the project's measuring-less logic picks on them.

For every shipped grid (`GRIDS`, benchmarks/data/public/, each file's source in its .md) and each of its workloads'
GPU-only slice (CPU and EMC clocks at their highest), through the replay device (`dvfs_mlops.hw.replay`):

- the adaptive sweep as `sweep --strategy adaptive` runs it on a board without a production governor: maxn (the
  grid's top setting), then the clocks `curve.next_clock` asks for from the middle of the table, at most
  `adaptive.MAX_PINNED`, leaning on the board prior of the workloads measured before; its pick is the predicted
  optimum of `adaptive.predicted_rows` (what predicted.csv marks). Reported: the settings it looked up, the curve
  model's energy error at the clocks it did not look up, and the regret of its pick against the grid's measured
  optimum (E(pick) / E(optimum) - 1; target: within 1.5 % from at most 5 settings);
- refine from the middle of the table (`refine.ProbePlan`, a 30-step budget as `finetune --refine` gives it, one
  settling step per re-pin as on hardware, the voltage curve fitted from the probes where the board's is unknown,
  the board's per-window noise): the clock it settles on, its regret and the training steps it spent probing;
- the saving of the measured optimum against the top clock (1 - E(optimum) / E(top));
- how rough the curve is, and whether the curve model's form or the noise limits the pick: the curve's local minima
  (a smooth U-shaped curve has one), the regret of the curve model's optimum when fitted to every clock of the slice
  (its voltage shape fitted too: the best this model does with no clock left unmeasured), and the regret of the
  optimum of a generic smoother over every clock (each clock's energy averaged with its table neighbours'). A curve
  with several local minima is rough: its measured optimum may be a dip no smooth model reaches. Where the generic
  smoother lands within the target and the curve model through every clock does not, the model's form is the limit.

Single-shot grids (one measurement per setting) carry their noise into every figure: a regret is one draw, not an
average. Nothing here writes anything outside a temporary folder: the timed `dvfs-mlops sweep --device replay` of the
BoFL grid's GPU-only slice (one MLflow run per point, end to end) logs into a fresh SQLite store there. The Perseus
grids are built from the per-workload curves next to them (`--rebuild`; those are built from raw/ by
`python -m benchmarks.public_curves --rebuild`).

    python -m benchmarks.real             # the markdown table and the notes on rough curves
    python -m benchmarks.real --rebuild   # regenerate the Perseus grids first
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "public"
# grid (file stem) -> the board, as the table names it
GRIDS = {
    "bofl-agx-xavier": "Jetson AGX Xavier",
    "perseus-a100-sxm": "A100-80G SXM",
    "perseus-a40": "A40-48G",
}
# Perseus grids: grid -> workload -> the per-workload curve (freq_mhz, time_s, energy_j) it is built from
PERSEUS = {
    "perseus-a100-sxm": {"bloom-stage0": "perseus-bloom-a100sxm", "gpt3-175b-stage0": "perseus-gpt3-175b-a100sxm"},
    "perseus-a40": {"bloom-stage0": "perseus-bloom-a40"},
}
REFINE_BUDGET = 30  # finetune --refine's default probe budget (steps)
REGRET_TARGET = 0.015
MAX_SETTINGS = 5


@dataclasses.dataclass(frozen=True)
class WorkloadResult:
    """One workload of one grid: what each method picked, against the grid's measured optimum."""

    grid: str
    board: str
    workload: str
    clocks: int
    optimum_mhz: float
    saving: float  # 1 - E(optimum) / E(top clock)
    adaptive_settings: tuple[float, ...]  # GPU clocks looked up, in order (maxn = the top clock)
    adaptive_pick_mhz: float
    adaptive_regret: float
    curve_error_mean: float  # at the clocks the adaptive sweep did not look up
    curve_error_max: float
    refine_pick_mhz: float
    refine_regret: float
    refine_steps: int
    refine_probes: tuple[float, ...]
    local_minima: int
    model_all_regret: float  # the curve model fitted to every clock of the slice: its optimum's regret
    smoothed_regret: float  # the optimum of each clock's energy averaged with its neighbours': its regret
    near_optimal: tuple[float, ...]  # clocks within REGRET_TARGET of the optimum

    @property
    def rough(self) -> bool:
        """More than one local minimum: the measured optimum may be a noise dip."""
        return self.local_minima > 1

    @property
    def model_limited(self) -> bool:
        """A generic smoother over every clock picks within the target, the curve model through every clock does not."""
        return self.smoothed_regret <= REGRET_TARGET < self.model_all_regret


def rebuild() -> list[Path]:
    """Write the Perseus grids (replay format) from the per-workload curves next to them; their values unchanged."""
    from dvfs_mlops.model.curve import read_measurements_csv

    written = []
    for grid, workloads in PERSEUS.items():
        out = DATA / f"{grid}.csv"
        with open(out, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["workload", "gpu_mhz", "time_s", "energy_j"])
            for workload, curve in workloads.items():
                for m in sorted(read_measurements_csv(str(DATA / f"{curve}.csv")), key=lambda m: m.freq_mhz):
                    w.writerow([workload, f"{m.freq_mhz:g}", f"{m.time_s:.9g}", f"{m.energy_j:.9g}"])
        written.append(out)
    return written


def evaluate_grid(name: str) -> list[WorkloadResult]:
    """Every workload of grid `name`, in the file's order (module doc)."""
    from dvfs_mlops.clocks import MAXN
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.mlops.sweep.adaptive import MAX_PINNED, predicted_rows
    from dvfs_mlops.model.curve import Measurement, next_clock
    from dvfs_mlops.model.power_prior import board_prior

    dev = ReplayDevice(DATA / f"{name}.csv")
    board = board_of(dev)
    table = sorted(board.frequencies_mhz)
    noise = board.noise(1)
    start = table[len(table) // 2]  # no production governor: the middle of the table
    swept: list[tuple[str, list[Measurement]]] = []
    for workload in dev.grid.workloads:
        dev.measure(workload, MAXN)
        measured: list[Measurement] = []
        so_far = board_prior([m for _, m in swept], voltage_shape=board.voltage_shape, f_max_mhz=board.f_max_mhz, noise=noise[1])
        while (f := next_clock(measured, table, start, max_clocks=MAX_PINNED, voltage_shape=board.voltage_shape, noise=noise,
                               prior=so_far)) is not None:
            found = dev.measure(workload, f)
            measured.append(Measurement(f, found.time_s, found.energy_j, None))
        swept.append((workload, measured))
    text, _ = predicted_rows(swept, board, 1)
    predicted: dict[str, dict[float, float]] = {}
    picks: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        predicted.setdefault(row["workload"], {})[float(row["freq_mhz"])] = float(row["predicted_energy_j"])
        if row["predicted_optimum"] == "1":
            picks[row["workload"]] = float(row["freq_mhz"])
    return [_judge(name, dev, board, workload, predicted[workload], picks[workload]) for workload, _ in swept]


def _judge(name: str, dev: Any, board: Any, workload: str, predicted: dict[float, float], pick: float) -> WorkloadResult:
    from dvfs_mlops.model.curve import fit_curve, fit_voltage_shape

    curve = {m.setting.gpu_mhz: m for m in dev.grid.gpu_slice(workload)}
    clocks = sorted(curve)
    energy = {f: curve[f].energy_j for f in clocks}
    best = min(clocks, key=energy.__getitem__)
    looked = [s.gpu_mhz for s in dev.looked_up(workload)]
    unmeasured = [f for f in clocks if f not in looked]
    errors = [abs(predicted[f] / energy[f] - 1.0) for f in unmeasured]
    refine_pick, probes, steps = _refine(board, clocks, workload, dev)
    points = [_measurement(curve[f]) for f in clocks]
    every = fit_curve(points, voltage_shape=fit_voltage_shape([points], clocks[-1]), f_max_mhz=clocks[-1])
    model_pick = min(every.predict(clocks), key=lambda p: p.energy_j).freq_mhz
    smoothed = {f: sum(energy[g] for g in clocks[max(0, i - 1):i + 2]) / len(clocks[max(0, i - 1):i + 2]) for i, f in enumerate(clocks)}
    smooth_pick = min(clocks, key=smoothed.__getitem__)
    minima = sum(1 for i, f in enumerate(clocks)
                 if all(energy[f] < energy[clocks[j]] for j in (i - 1, i + 1) if 0 <= j < len(clocks)))
    return WorkloadResult(
        grid=name, board=GRIDS.get(name, name), workload=workload, clocks=len(clocks), optimum_mhz=best,
        saving=1.0 - energy[best] / energy[clocks[-1]], adaptive_settings=tuple(looked), adaptive_pick_mhz=pick,
        adaptive_regret=energy[pick] / energy[best] - 1.0,
        curve_error_mean=sum(errors) / len(errors) if errors else 0.0, curve_error_max=max(errors, default=0.0),
        refine_pick_mhz=refine_pick, refine_regret=energy[refine_pick] / energy[best] - 1.0, refine_steps=steps,
        refine_probes=probes, local_minima=minima, model_all_regret=energy[model_pick] / energy[best] - 1.0,
        smoothed_regret=energy[smooth_pick] / energy[best] - 1.0,
        near_optimal=tuple(f for f in clocks if energy[f] / energy[best] - 1.0 <= REGRET_TARGET))


def _measurement(lookup: Any) -> Any:
    from dvfs_mlops.model.curve import Measurement

    return Measurement(lookup.setting.gpu_mhz, lookup.time_s, lookup.energy_j, None)


def _refine(board: Any, table: list[float], workload: str, dev: Any) -> tuple[float, tuple[float, ...], int]:
    """Refine from the middle of the table on the replayed workload: (the clock it settles on, the clocks it probed, the
    training steps spent probing and settling)."""
    from dvfs_mlops.job.refine import SETTLE_STEPS, ProbePlan

    settle = 0 if board.simulated else SETTLE_STEPS
    plan = ProbePlan(table[len(table) // 2], table, REFINE_BUDGET, voltage_shape=board.voltage_shape if board.voltage_shape_known else None,
                     noise=board.noise(), settle=settle)
    probed = []
    while (f := plan.next_clock()) is not None:
        plan.record(_measurement(dev.grid.mean(workload, dev.grid.slice_setting(f))))
        probed.append(f)
    chosen = float(plan.chosen_mhz if plan.chosen_mhz is not None else table[len(table) // 2])
    return chosen, tuple(probed), len(probed) * (plan.per_probe + settle)


def replay_time(name: str, repeats: int = 5) -> tuple[float, float, int]:
    """(seconds to open the grid, seconds to play every workload at every GPU clock of its slice as one session of one
    step each, sessions played): the medians of `repeats` runs, device-level (no MLflow)."""
    import statistics

    from dvfs_mlops.hw.replay import ReplayDevice

    opens, plays, sessions = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        dev = ReplayDevice(DATA / f"{name}.csv")
        t1 = time.perf_counter()
        sessions = 0
        for workload in dev.grid.workloads:
            for f in dev.frequencies_mhz:
                with dev.session(f, workload=workload) as s:
                    s.step()
                s.report()
                sessions += 1
        plays.append(time.perf_counter() - t1)
        opens.append(t1 - t0)
    return statistics.median(opens), statistics.median(plays), sessions


def sweep_time(name: str) -> tuple[float, int, list[dict[str, Any]]]:
    """(wall seconds, points, `sweep --json`'s picks) of `dvfs-mlops sweep --device replay` over the grid's GPU-only
    slice, end to end (one MLflow run per point, summary, plots) into a fresh SQLite store whose schema is made first
    (MLflow's migrations are not the sweep's). One run: the figure of record, not a median."""
    import json
    import os
    import re
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "DVFS_TORCH_DEVICE": "cpu",
               "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", "from mlflow.tracking import MlflowClient; MlflowClient().search_experiments()"],
                       env=env, cwd=tmp, check=True, capture_output=True)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "dvfs_mlops", "sweep", "--device", "replay", "--trace", str(DATA / f"{name}.csv"),
                               "--claims", "none", "--json"], env=env, cwd=tmp, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    picks = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    ran = re.search(r": ran (\d+) points", done.stderr)
    return wall, int(ran.group(1)) if ran else 0, picks


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _clocks(values: tuple[float, ...]) -> str:
    return ", ".join(f"{f:g}" for f in values)


def table(results: list[WorkloadResult]) -> list[str]:
    """The markdown table of every workload's figures."""
    lines = [("| grid (board) | workload | optimum (saving vs top) | adaptive: settings looked up | adaptive pick, regret | "
              "curve error at the others (mean / max) | refine from mid-table: pick, regret, steps | local minima | "
              "every clock: curve model's regret / smoother's |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.grid} ({r.board}) | {r.workload} | {r.optimum_mhz:g} MHz ({_pct(r.saving)}) | "
                     f"{len(r.adaptive_settings)}: {_clocks(r.adaptive_settings)} | {r.adaptive_pick_mhz:g} MHz, {_pct(r.adaptive_regret)} | "
                     f"{_pct(r.curve_error_mean)} / {_pct(r.curve_error_max)} | "
                     f"{r.refine_pick_mhz:g} MHz, {_pct(r.refine_regret)}, {r.refine_steps} | {r.local_minima} | "
                     f"{_pct(r.model_all_regret)} / {_pct(r.smoothed_regret)} |")
    return lines


def notes(results: list[WorkloadResult]) -> list[str]:
    """One line per curve that is rough (more than one local minimum) or whose pick the curve model's form limits: which,
    and how the picks fare there."""
    out = []
    for r in results:
        said = []
        if r.rough:
            said.append(f"rough: {r.local_minima} local minima over {r.clocks} clocks, so its single-shot optimum may be a "
                        f"noise dip; a smoother over every clock picks within {_pct(r.smoothed_regret)}")
        if r.model_limited:
            said.append(f"the curve model's form, not the noise, limits the pick: fitted to all {r.clocks} clocks its optimum is "
                        f"{_pct(r.model_all_regret)} off, the smoother's {_pct(r.smoothed_regret)}")
        if not said:
            continue
        out.append(f"- {r.grid} {r.workload}: {'; '.join(said)}. {len(r.near_optimal)} clock(s) lie within {_pct(REGRET_TARGET)} of "
                   f"the measured optimum ({_clocks(r.near_optimal)} MHz); the adaptive sweep picks {r.adaptive_pick_mhz:g} MHz "
                   f"({'inside' if r.adaptive_pick_mhz in r.near_optimal else 'outside'} that band, {_pct(r.adaptive_regret)}), "
                   f"refine {r.refine_pick_mhz:g} MHz ({_pct(r.refine_regret)}).")
    return out


def results() -> list[WorkloadResult]:
    return [r for name in GRIDS for r in evaluate_grid(name)]


def run() -> list[tuple[str, str, str]]:
    """The benchmark's rows (metric, value, target) for `python -m benchmarks`."""
    rows = []
    for r in results():
        what = f"[{r.grid}] {r.workload}"
        rows.append((f"{what}: adaptive sweep, settings looked up; regret of its pick (REPLAYED)",
                     f"{len(r.adaptive_settings)}; {_pct(r.adaptive_regret)}", f"<= {MAX_SETTINGS}; <= {_pct(REGRET_TARGET)}"))
        rows.append((f"{what}: curve model energy error at the clocks not looked up (mean / max)",
                     f"{_pct(r.curve_error_mean)} / {_pct(r.curve_error_max)}", "-"))
        rows.append((f"{what}: refine from mid-table: regret; probe steps", f"{_pct(r.refine_regret)}; {r.refine_steps}", "-"))
        rows.append((f"{what}: saving of the measured optimum vs the top clock", _pct(r.saving), "-"))
    opened, played, sessions = replay_time("bofl-agx-xavier")
    rows.append((f"[bofl-agx-xavier] open the grid; replay its GPU-only slice ({sessions} sessions)",
                 f"{1000 * opened:.0f} ms; {1000 * played:.1f} ms", "-"))
    wall, points, picks = sweep_time("bofl-agx-xavier")
    best = ", ".join(sorted({f"{p['best']['gpu_mhz']:g}" for p in picks}))
    what = f"[bofl-agx-xavier] `dvfs-mlops sweep --device replay` of the GPU-only slice, end to end ({points} MLflow runs; picks {best} MHz)"
    rows.append((what, f"{wall:.1f} s", "-"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="regenerate the Perseus grids from the per-workload curves first")
    args = ap.parse_args(argv)
    if args.rebuild:
        for path in rebuild():
            print(f"wrote {path}")
    found = results()
    print("\n".join(table(found)))
    rough = notes(found)
    if rough:
        print("\nWhere a curve is rough or the curve model's form limits the pick (single-shot measurements):\n" + "\n".join(rough))
    opened, played, sessions = replay_time("bofl-agx-xavier")
    print(f"\nReplay of the BoFL grid's GPU-only slice, device-level: open {1000 * opened:.0f} ms, "
          f"{sessions} sessions {1000 * played:.1f} ms (median of 5).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
