"""Moving a governor to another board from a few measured points (issue 34): `python -m benchmarks transfer`.

SIMULATED part, on the twin's expected curves of the paper preset (benchmarks.governor_quality.paper_curves), one
built-in profile per board family (the AGX Orin 64 GB is sim-orin-measured, the untuned one the module profiles are
scaled from). Each family's production governor is the Optuna search on its 36 characterisation workloads
(search.run_search, DVFS_BENCH_TRIALS trials). For every pair source -> target, held-out regret against the expected
oracle on the target's 72 evaluation workloads of:
- calibrated: the source governor moved by model.governor.transfer from the calibration points (plan_calibration on
  the target's characterisation workloads, each with its features as the source's own sweep measured them, as
  `dvfs-mlops calibrate` gives them where the source's sweep is in the store; the measured, noisy draws at the
  planned clocks);
- ceiling: the target's own governor, trained on its full sweep;
- FFG on the calibration points: the one clock of the planned ones with the least mean normalised energy over the
  calibration workloads;
- snapped source: the source governor's clock snapped to the target's table (what happened before calibration);
- best fixed clock: the one clock best for all the held-out workloads (chosen on them): the floor of a governor
  without splits (a depth-0 source: the NX 8 GB's and Nano's own governors pick the top clock for everything).
Goals: calibrated within 0.3 % of the oracle on every pair, and closer to the ceiling than FFG on every pair.
The published tree (`registry bootstrap`, a classifier of the AGX Orin 64 GB with no sweep: its calibration workloads
are planned by name) is a further source, onto every other family.

REAL part (benchmarks/data/public/, provenance in the .md files): the only workload measured on both the A100 and
the A40 (BLOOM stage 0, perseus-bloom-*): the curve on one GPU is the source (a one-leaf curve policy), 4 clocks of
the other (spread over its table) calibrate it; energy error at the other measured clocks and the measured regret of
the clock it picks. With one calibration workload that reaches the one leaf, the board shifts make the leaf that
workload's own 4-point fit by construction (model.governor.transfer's shares with the fitted voltage shape): the
rows say what the curve shapes give on real GPUs, not what the source's knowledge adds.

usage: python -m benchmarks transfer  (DVFS_BENCH_TRIALS, default 60; DVFS_BENCH_TRANSFER_PROFILES narrows the boards)
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common import RESULTS

PROFILES = ("sim-orin-measured", "sim-orin-32gb", "sim-orin-nx-16gb", "sim-orin-nx-8gb", "sim-orin-nano-8gb",
            "sim-orin-nano-8gb-super")
GOAL_REGRET = 0.003


@dataclasses.dataclass
class _Board:
    profile: str
    board: Any
    curves: list[Any]
    freqs: list[float]
    policy: dict[str, Any]
    steps: int

    def split(self, name: str) -> list[Any]:
        return [c for c in self.curves if c.split == name]


def _load(profile: str, trials: int) -> _Board:
    from benchmarks.governor_quality import paper_dataset
    from dvfs_mlops.mlops.sweep.spec import PRESETS
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import run_search

    ds = paper_dataset(profile)
    res = run_search(ds, parse_objective("energy"), trials=trials, seed=0, outer_trials=2, outer_splits=())
    return _Board(profile, ds.board, ds.curves, ds.frequencies, res.policy.policy, PRESETS["paper"].profile_steps)


def _mean_regret(policy: Any, curves: list[Any]) -> float:
    from dvfs_mlops.model.governor.objectives import parse_objective

    energy = parse_objective("energy")
    return statistics.mean(c.regret(policy.choose(c.features, c.clocks), energy) for c in curves)


def pair(source: _Board, target: _Board) -> dict[str, Any]:
    """Every figure of one source -> target pair (module doc)."""
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.policies import FixedPolicy, TreePolicy
    from dvfs_mlops.model.governor.policy_tree import tree_depth
    from dvfs_mlops.model.governor.transfer import calibrate_policy, plan_calibration

    train, held = target.split("train"), target.split("eval")
    # the candidates as calibrate gives them: each with its features from the source's own sweep (measured there)
    known = {c.workload: c.features for c in source.curves}
    plan = plan_calibration(source.policy, target.board, [(c.workload, known.get(c.workload, c.features.with_gpu_util(None)))
                                                          for c in train])
    cal = [dataclasses.replace(c, energy_j={f: c.energy_j[f] for f in plan.clocks_mhz}, time_s={f: c.time_s[f] for f in plan.clocks_mhz},
                               gpu_util_pct={f: c.gpu_util_pct[f] for f in plan.clocks_mhz if f in c.gpu_util_pct})
           for c in train if c.workload in plan.workloads]
    moved = calibrate_policy(source.policy, target.board, cal, {w: f for w, f in known.items() if w in plan.workloads})
    out = {"source": source.profile, "target": target.profile, "source_family": source.board.family,
           "target_family": target.board.family, "plan_workloads": list(plan.workloads), "plan_clocks": list(plan.clocks_mhz),
           "cost_steps": plan.cost(target.steps), "target_steps": target.steps, "board_constants": moved["board_constants"],
           "calibrated": _mean_regret(TreePolicy(moved, "calibrated"), held),
           "ceiling": _mean_regret(TreePolicy(target.policy, "ceiling"), held),
           "ffg_calibration": _mean_regret(FixedPolicy.fit(cal, parse_objective("energy")), held),
           "snapped_source": _mean_regret(TreePolicy(source.policy, "snapped"), held),
           # the best one clock for every held-out workload (chosen on them): what a governor without splits can reach
           "best_fixed": min(_mean_regret(FixedPolicy(f, "fixed"), held) for f in target.freqs)}
    out["within_goal"] = out["calibrated"] <= GOAL_REGRET
    # closer to the ceiling: a smaller gap above it (a calibrated governor that beats the ceiling is closest of all)
    gap, ffg_gap = out["calibrated"] - out["ceiling"], out["ffg_calibration"] - out["ceiling"]
    out["closer_than_ffg"] = gap < ffg_gap - 1e-9
    out["tie_with_ffg"] = abs(gap - ffg_gap) <= 1e-9  # both as far from the ceiling (on the smallest boards all pick the top)
    out["source_tree_depth"] = tree_depth(source.policy["tree"])
    return out


def published_source() -> _Board:
    """The published tree (`registry bootstrap`, what a fresh install has as production) as a source: a classifier of
    the AGX Orin 64 GB with no sweep of its own, so calibrate plans its workloads by name."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.model.governor.policies import paper_tree

    board = board_of(SimDevice(builtin_profile("sim-orin")))
    return _Board("published tree (paper-mlg)", board, [], list(board.frequencies_mhz), paper_tree().policy, 0)


def real_pairs() -> list[dict[str, Any]]:
    """REAL: the BLOOM stage measured on both the A100 and the A40, each direction (module doc)."""
    from benchmarks.public_curves import DATA
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.model.curve import read_measurements_csv
    from dvfs_mlops.model.governor.dataset import WorkloadCurve
    from dvfs_mlops.model.governor.transfer import calibrate_policy, spread_clocks
    from dvfs_mlops.model.workload import WorkloadFeatures

    gpus = {"A100-80G SXM": "perseus-bloom-a100sxm", "A40-48G": "perseus-bloom-a40"}
    curves = {g: sorted(read_measurements_csv(str(DATA / f"{n}.csv")), key=lambda m: m.freq_mhz) for g, n in gpus.items()}
    feats = WorkloadFeatures("decoder", 70, 14336, 176_000_000_000, 2048.0, None)
    out = []
    for src, dst in (("A100-80G SXM", "A40-48G"), ("A40-48G", "A100-80G SXM")):
        s, t = curves[src], curves[dst]
        e_min, t_top = min(m.energy_j for m in s), s[-1].time_s
        policy = {"format": "dvfs-governor-policy/1", "family": "curve", "clocks_mhz": [m.freq_mhz for m in s],
                  "tree": {"energy": [m.energy_j / e_min for m in s], "time": [m.time_s / t_top for m in s], "samples": 1}}
        table = [m.freq_mhz for m in t]
        board = Board("nvml", dst, dst, "", False, tuple(table))  # its voltage curve unknown: fitted from the 4 clocks
        fit = spread_clocks(table, 4)
        meas = {m.freq_mhz: m for m in t}
        cal = WorkloadCurve("bloom/stage0", "train", feats, {f: meas[f].energy_j for f in fit}, {f: meas[f].time_s for f in fit},
                            meas[table[-1]].energy_j, meas[table[-1]].time_s)
        moved = calibrate_policy(policy, board, [cal])
        pred = dict(zip(moved["clocks_mhz"], moved["tree"]["energy"]))
        scale = statistics.geometric_mean([meas[f].energy_j / pred[f] for f in fit])
        held = [f for f in table if f not in fit]
        errors = [abs(scale * pred[f] / meas[f].energy_j - 1.0) for f in held]
        picked = min(table, key=lambda f: (pred[f], -f))
        best = min(table, key=lambda f: meas[f].energy_j)
        snapped = min(table, key=lambda f: (abs(f - min(s, key=lambda m: m.energy_j).freq_mhz), -f))
        out.append({"source": src, "target": dst, "clocks": len(table), "fit_clocks": list(fit), "mean_err": statistics.mean(errors),
                    "max_err": max(errors), "picked": picked, "optimum": best,
                    "regret": meas[picked].energy_j / meas[best].energy_j - 1.0, "snapped_source_clock": snapped,
                    "snapped_regret": meas[snapped].energy_j / meas[best].energy_j - 1.0,
                    "voltage_shape": moved["board_constants"]["voltage_shape"]})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.3f} %"


def run() -> list[tuple[str, str, str]]:
    trials = int(os.environ.get("DVFS_BENCH_TRIALS", "60"))
    names = [n.strip() for n in os.environ.get("DVFS_BENCH_TRANSFER_PROFILES", ",".join(PROFILES)).split(",") if n.strip()]
    t0 = time.process_time()
    boards = [_load(n, trials) for n in names]
    t_boards = time.process_time() - t0
    t0 = time.process_time()
    pairs = [pair(s, t) for s in boards for t in boards if s is not t]
    t_pairs = time.process_time() - t0
    published = published_source()
    from_published = [pair(published, t) for t in boards if t.board.family != published.board.family]
    rows: list[tuple[str, str, str]] = [
        ("SIMULATED boards (family: profile, clocks)", "; ".join(f"{b.board.family}: {b.profile}, {len(b.freqs)}" for b in boards),
         "-"),
        ("SIMULATED cost", f"governors ({trials} trials each) {t_boards:.0f} s CPU; {len(pairs)} calibrations {t_pairs:.1f} s CPU", "-")]
    for p in [*pairs, *from_published]:
        k = p["board_constants"]
        cost = f"{len(p['plan_clocks'])} clocks x {len(p['plan_workloads'])} workloads x {p['target_steps']} steps = {p['cost_steps']} steps"
        shift = (f"place shift {k['place_shift']:+.2f}, {len(k.get('measured_leaves', {}))} leaves measured" if "place_shift" in k
                 else f"time/power shift {k['time_shift']:+.2f}/{k['power_shift']:+.2f}"
                 + (", split by the calibration points' utilisation" if "util_fit" in k else "")
                 + (f", utilisation shift {k['util_shift']:+.2f}" if "util_shift" in k else ""))
        source = p["source"] if p["source"].startswith("published") else p["source_family"]
        rows.append(((f"SIMULATED {source} -> {p['target_family']}: held-out regret calibrated / ceiling / FFG on "
                     f"the calibration points / snapped source / best fixed clock ({cost}; {shift})"),
                     (f"{_pct(p['calibrated'])} / {_pct(p['ceiling'])} / {_pct(p['ffg_calibration'])} / {_pct(p['snapped_source'])} / "
                     f"{_pct(p['best_fixed'])}"),
                     (f"calibrated <= 0.3 % ({'met' if p['within_goal'] else 'MISSED'}); closer to ceiling than FFG "
                     f"({'met' if p['closer_than_ffg'] else 'tie' if p['tie_with_ffg'] else 'MISSED'}); source tree depth "
                     f"{p['source_tree_depth']}")))
    rows.append(("SIMULATED pairs meeting each goal (<= 0.3 % / closer than FFG, ties with FFG apart)",
                 (f"{sum(p['within_goal'] for p in pairs)} / {sum(p['closer_than_ffg'] for p in pairs)} (+{sum(p['tie_with_ffg'] for p in pairs)} "
                 f"ties) of {len(pairs)}"), "all"))
    rows.append(("SIMULATED mean over pairs: calibrated / ceiling / FFG / snapped / best fixed clock",
                 " / ".join(_pct(statistics.mean(p[k] for p in pairs)) for k in ("calibrated", "ceiling", "ffg_calibration",
                                                                                  "snapped_source", "best_fixed")), "-"))
    rows.append(("SIMULATED pairs whose calibrated governor is no worse than the snapped source",
                 (f"{sum(p['calibrated'] <= p['snapped_source'] + 1e-9 for p in pairs)} of {len(pairs)}; published tree: "
                 f"{sum(p['calibrated'] <= p['snapped_source'] + 1e-9 for p in from_published)} of {len(from_published)}"), "-"))
    real = real_pairs()
    for r in real:
        rows.append(((f"REAL BLOOM stage 0, {r['source']} -> {r['target']} (calibrated on {'/'.join(f'{f:g}' for f in r['fit_clocks'])} "
                     f"MHz of {r['clocks']} clocks, r fitted {r['voltage_shape']:.2f})"),
                     (f"energy error at the other clocks mean {_pct(r['mean_err'])} max {_pct(r['max_err'])}; picks {r['picked']:g} MHz vs "
                     f"measured optimum {r['optimum']:g}: regret {_pct(r['regret'])} (source's optimum snapped: {r['snapped_source_clock']:g} "
                     f"MHz, regret {_pct(r['snapped_regret'])})"), "-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "transfer.json").write_text(json.dumps({"pairs": pairs, "published": from_published, "real": real, "rows": rows}, indent=2, default=str))
    return rows


if __name__ == "__main__":
    for m, v, t in run():
        print(f"{m}: {v} (target {t})")
