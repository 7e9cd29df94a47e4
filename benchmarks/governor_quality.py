"""Governor quality on the paper preset (12 models x 9 tasks, every clock + maxn) of the twin, on every built-in
twin profile (one per Orin module people own, and the untuned AGX Orin 64 GB).

The paper preset's curves are built here straight from the twin, not through MLflow runs (1296 of them per profile):
for every workload, the step trace at the median padded length of its planned batches (as the
launcher's twin estimate does), the twin's noise-free per-step time and energy at each clock and
at maxn (the expected curve, what the runs' `energy_expected_j`/`time_expected_s` carry), and the
measured draws with exactly the sweep's seeded noise (`SimDevice.session(freq, label=
"<workload>#<repeat>")`), scaled by the preset's profile_steps. The dataset carries the profile's board
record, as a sweep's parent run does. Everything here is SIMULATED.

Figures (all against the expected oracle, mean over workloads, bootstrap 95 % interval):
- the table first: per profile, held-out tasks (train on the 36 characterisation workloads of 3 tasks, judge the
  72 eval-task ones) for the production governor (`run_search`: Optuna over curve trees, classifier trees, the fixed
  clock and the published tree, nested CV, FFG's clock as the floor), FFG and the published tree. Target: <= 0.1 %,
  no worse than FFG, below the published tree. With several seeds (DVFS_BENCH_GOVERNOR_SEEDS) each figure is the
  mean over the seeds' governors (the search's outcome varies with its seed; one draw of it is not the figure).
- per profile: which family won and why (`SearchResult.description`), the nested CV figures, leave one model
  out (nested: each fold selects on the other 11 models' workloads; target <= 0.3 %), max-slowdown:1.10 and EDP
  from the same version.
- what limits a governor on flat curves, measured on the 36 training workloads: the regret of each workload's own
  best clock as one draw per clock measures it and as the curve model's fit of those draws puts it; the curve
  model's check (each interior clock predicted without it, against the line between its neighbours); and the
  median held-out regret of 48 fixed curve-tree configurations (depth 2-5, leaf 1-3, split 2/5, two feature sets)
  learnt four ways: from the measured draws or the fits, their splits grown on the whole normalised curve or on each
  workload's best clock, and (the bound) from the noise-free curves (DVFS_BENCH_ABLATION=0 skips it).
- the same search on the train workloads as an adaptive sweep leaves them (at most 4 pinned clocks, the
  rest from each workload's curve fit): its held-out regret against the full grid's. Target: within 0.05
  points (DVFS_BENCH_ADAPTIVE=0 skips it).

Why a selection picks a family (per-family inner estimates against their held-out regret, over seeds; writes
benchmarks/results/governor_selection.md): python -m benchmarks.governor_quality selection [PROFILES [SEEDS [TRIALS]]].

usage: python -m benchmarks governor   (DVFS_BENCH_TWIN_PROFILES: a comma-separated subset of the built-in profiles,
default all; DVFS_BENCH_TRIALS, default 60; DVFS_BENCH_OUTER_TRIALS, default 15; DVFS_BENCH_SWEEP_REPEATS (runs per sweep point), default 1;
DVFS_BENCH_GOVERNOR_SEEDS, default 1; DVFS_BENCH_ADAPTIVE, default 1; DVFS_BENCH_ABLATION, default 1)
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common import RESULTS


def paper_curves(repeats: int = 1, seed: int = 0, profile: str = "sim-orin") -> tuple[list[Any], list[float]]:
    """WorkloadCurves of the paper preset on a built-in twin profile: expected and measured (noisy draws)."""
    from dvfs_mlops.clocks import MAXN
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.job.finetune import plan_batches
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.job.workloads.tasks import get_task
    from dvfs_mlops.job.workloads.tokenizer import padded_length
    from dvfs_mlops.mlops.sweep.spec import PRESETS
    from dvfs_mlops.model.governor.dataset import WorkloadCurve

    preset = PRESETS["paper"]
    dev = SimDevice(builtin_profile(profile), seed=seed)
    steps, batch = preset.profile_steps, 16
    freqs = dev.frequencies_mhz
    curves = []
    for model in preset.models:
        for task in preset.tasks:
            p = prepare_workload(model, task, seed=seed, train_size=preset.train_size, dev_size=preset.dev_size)
            batches = plan_batches(p.n_train, steps, batch, seed)
            lengths = sorted(padded_length([p.train_lengths[i] for i in b]) for b in batches)
            trace = p.trace_provider(batch)(lengths[len(lengths) // 2])
            curve, maxn = dev.curve(trace)
            workload = f"{model}/{task}"
            e_exp = {f: curve[f].energy_j * steps for f in freqs}
            t_exp = {f: curve[f].time_s * steps for f in freqs}
            e_meas: dict[float, float] = {}
            t_meas: dict[float, float] = {}
            me, mt = [], []
            for r in range(repeats):
                for f in freqs:
                    s = dev.session(f, label=f"{workload}#{r}")
                    e_meas[f] = e_meas.get(f, 0.0) + e_exp[f] * s.time_factor * s.power_factor / repeats
                    t_meas[f] = t_meas.get(f, 0.0) + t_exp[f] * s.time_factor / repeats
                s = dev.session(MAXN, label=f"{workload}#{r}")
                me.append(maxn.energy_j * steps * s.time_factor * s.power_factor)
                mt.append(maxn.time_s * steps * s.time_factor)
            feats = p.features.with_gpu_util(100.0 * maxn.gpu_util)
            curves.append(WorkloadCurve(workload, get_task(task).split, feats, e_meas, t_meas, statistics.mean(me), statistics.mean(mt),
                                        {}, e_exp, t_exp, maxn.energy_j * steps, maxn.time_s * steps,
                                        {f: 100.0 * curve[f].gpu_util for f in freqs}))  # the twin's busy share is the same in every draw
    return curves, [float(f) for f in freqs]


def adaptive_curves(curves: list[Any], freqs: list[float], profile: str = "sim-orin") -> tuple[list[Any], float]:
    """The same workloads as an adaptive sweep would leave them (`sweep --strategy adaptive`, no production
    governor: it starts mid-table): each workload's draws only at the clocks `next_clock` asks for, the other
    clocks filled from its curve fit as `train` fills them (governor/dataset.py). Expected values untouched.
    Returns the curves and the mean number of pinned clocks measured per workload."""
    import dataclasses

    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.mlops.sweep.adaptive import MAX_PINNED
    from dvfs_mlops.model.curve import Measurement, next_clock
    from dvfs_mlops.model.governor.dataset import fill_from_curves
    from dvfs_mlops.model.power_prior import board_prior

    table = sorted(freqs)
    start = table[len(table) // 2]
    board = board_of(SimDevice(builtin_profile(profile)))
    shape = board.voltage_shape  # what the sweep's next_clock uses on this profile
    out, counts, gaps = [], [], []
    sweep: list[list[Measurement]] = []
    for c in curves:
        got: list[Measurement] = []
        so_far = board_prior(sweep, voltage_shape=shape, f_max_mhz=table[-1])  # as the sweep's next_clock leans on it
        while (f := next_clock(got, table, start, max_clocks=MAX_PINNED, voltage_shape=shape, prior=so_far)) is not None:
            got.append(Measurement(f, c.time_s[f], c.energy_j[f], c.gpu_util_pct[f] / 100.0 if f in c.gpu_util_pct else None))
        sweep.append(got)
        energy = {m.freq_mhz: m.energy_j for m in got}
        time_s = {m.freq_mhz: m.time_s for m in got}
        util = {m.freq_mhz: c.gpu_util_pct[m.freq_mhz] for m in got if m.freq_mhz in c.gpu_util_pct}
        gaps.append((energy, time_s, util))
        counts.append(len(got))
        out.append(dataclasses.replace(c, energy_j=energy, time_s=time_s, gpu_util_pct=util))
    fill_from_curves(gaps, table, range(len(gaps)), board)  # as train fills them, on the sweep's board; in place
    return out, statistics.mean(counts)


def paper_dataset(profile: str = "sim-orin", repeats: int = 1, seed: int = 0) -> Any:
    """The paper preset on a built-in twin profile as `train` reads a sweep of it: a `GovernorDataset` with the
    profile's board record (`board_of`, the sweep's board.json)."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.model.governor.dataset import GovernorDataset

    curves, freqs = paper_curves(repeats, seed, profile)
    return GovernorDataset(curves, freqs, f"paper-{profile}", profile, True, repeats, board_of(SimDevice(builtin_profile(profile))))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.3f} %"


def _ci(ci: Any) -> str:
    return f"[{100 * ci[0]:.3f}, {100 * ci[1]:.3f}] %"


TARGET = 0.001  # held-out regret against the expected oracle, as a fraction
ABLATION_GRID = [(depth, leaf, split, features) for depth in (2, 3, 4, 5) for leaf in (1, 2, 3) for split in (2, 5)
                 for features in (("is_decoder", "num_layers", "hidden_size", "num_params", "avg_seq_len", "gpu_util_pct"),
                                  ("gpu_util_pct", "num_params", "avg_seq_len"))]


@dataclasses.dataclass
class ProfileResult:
    """One profile's table line (held-out tasks, against the expected oracle; means over the seeds' governors) and its
    detail rows."""

    profile: str
    governor: float
    ffg: float
    paper: float
    registered: list[str]  # per seed: the family of the version registered, and its depth
    rows: list[tuple[str, str, str]]

    @property
    def met(self) -> bool:
        return self.governor <= TARGET and self.governor <= self.ffg + 1e-12 and self.governor < self.paper


def table(results: list[ProfileResult], title: str = "") -> str:
    """The issue's table: one line per profile, held-out regret of the governor, FFG and the published tree."""
    lines = [title, ""] if title else []
    lines += ["| profile | governor | FFG | published tree | registered | <= 0.1 %, <= FFG, < published |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.profile} | {_pct(r.governor)} | {_pct(r.ffg)} | {_pct(r.paper)} | {', '.join(r.registered)} | "
              f"{'met' if r.met else 'MISSED'} |" for r in results]
    return "\n".join(lines) + "\n"


def run() -> list[tuple[str, str, str]]:
    """Every built-in profile (DVFS_BENCH_TWIN_PROFILES narrows it): the table's rows first, then each profile's block.
    Also writes the table to benchmarks/results/governor_table.md."""
    from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES

    wanted = os.environ.get("DVFS_BENCH_TWIN_PROFILES", "")
    names = [n.strip() for n in wanted.split(",") if n.strip()] or list(BUILTIN_PROFILES)
    unknown = [n for n in names if n not in BUILTIN_PROFILES]
    if unknown:
        raise SystemExit(f"DVFS_BENCH_TWIN_PROFILES: unknown twin profile(s) {', '.join(unknown)}; profiles: {', '.join(BUILTIN_PROFILES)}")
    results = [run_profile(name) for name in names]
    rows = [(f"{r.profile}: held-out tasks, governor / FFG / published tree (expected oracle)",
             f"{_pct(r.governor)} / {_pct(r.ffg)} / {_pct(r.paper)}; registered {', '.join(r.registered)}",
             f"<= 0.1 %, <= FFG, < published tree: {'met' if r.met else 'MISSED'}") for r in results]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "governor_table.md").write_text(table(results, _settings()))
    return rows + [row for r in results for row in r.rows]


def _settings() -> str:
    return (f"SIMULATED paper preset; {os.environ.get('DVFS_BENCH_TRIALS', '60')} trials, "
            f"{os.environ.get('DVFS_BENCH_OUTER_TRIALS', '15')} per outer fold, "
            f"{os.environ.get('DVFS_BENCH_SWEEP_REPEATS', '1')} repeat(s), {os.environ.get('DVFS_BENCH_GOVERNOR_SEEDS', '1')} seed(s); "
            "held-out tasks, regret against the twin's expected oracle")


def run_profile(profile: str) -> ProfileResult:
    from dvfs_mlops.mlops.evaluate import evaluate_dataset
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.policies import FixedPolicy, MaxNPolicy, OraclePolicy, TreePolicy, paper_tree
    from dvfs_mlops.model.governor.policy_tree import features_used
    from dvfs_mlops.model.governor.search import nested_cv, run_search

    trials = int(os.environ.get("DVFS_BENCH_TRIALS", "60"))
    outer = int(os.environ.get("DVFS_BENCH_OUTER_TRIALS", "15"))
    repeats = int(os.environ.get("DVFS_BENCH_SWEEP_REPEATS", "1"))
    seeds = int(os.environ.get("DVFS_BENCH_GOVERNOR_SEEDS", "1"))
    t0 = time.process_time()
    ds = paper_dataset(profile, repeats)
    curves, freqs = ds.curves, ds.frequencies
    t_data = time.process_time() - t0
    energy = parse_objective("energy")
    train = ds.split("train").curves
    ffg_policy = FixedPolicy.fit(train, energy)
    searches = []
    t0 = time.process_time()
    for seed in range(seeds):
        res = run_search(ds, energy, trials=trials, seed=seed, storage="sqlite:///:memory:", outer_trials=outer)
        policies = {"governor": res.policy, "ffg": ffg_policy, "paper-mlg": paper_tree(), "maxn": MaxNPolicy(), "oracle": OraclePolicy(energy)}
        searches.append((res, {s.policy: s for s in evaluate_dataset(ds, policies, energy, "eval").summaries}))
    t_search = (time.process_time() - t0) / seeds
    res, held = searches[0]
    registered = [f"{r.family} d{r.metrics()['tree_depth']:.0f}" for r, _ in searches]
    mean_of = {name: statistics.mean(h[name].mean_regret_expected for _, h in searches) for name in ("governor", "ffg", "paper-mlg")}
    t0 = time.process_time()
    lomo = nested_cv(ds.curves, energy, freqs, "model", outer, 0)
    t_lomo = time.process_time() - t0
    curve_family = res.policy.policy.get("family") == "curve"
    slow = parse_objective("max-slowdown:1.10")
    edp = parse_objective("edp")
    bound = slow_regret = edp_regret = None
    if curve_family:
        eval_curves = ds.split("eval").curves
        gov_slow = TreePolicy(res.policy.policy, "governor", objective=slow.name)
        hits = 0
        for c in eval_curves:
            f = c.nearest(gov_slow.choose(c.features, c.clocks))
            hits += c.time_expected_s[f] <= 1.10 * c.maxn_time_expected_s * (1 + 1e-9)
        bound = hits / len(eval_curves)
        slow_regret = evaluate_dataset(ds, {"governor": gov_slow}, slow, "eval").summaries[0]
        edp_regret = evaluate_dataset(ds, {"governor": TreePolicy(res.policy.policy, "governor", objective="edp")}, edp,
                                      "eval").summaries[0]
    ffg_slow = evaluate_dataset(ds, {"ffg": FixedPolicy.fit(train, slow)}, slow, "eval").summaries[0]
    ffg_edp = evaluate_dataset(ds, {"ffg": FixedPolicy.fit(train, edp)}, edp, "eval").summaries[0]
    g, f, pm, oracle = held["governor"], held["ffg"], held["paper-mlg"], held["oracle"]
    what = res.description().split("\n\n")
    rows = [
        (f"SIMULATED paper preset, {profile}", (f"{len(curves)} workloads ({len(train)} train, {len(curves) - len(train)} eval), "
                                    f"{len(freqs)} clocks, {repeats} repeat(s); curves built in {t_data:.0f} s CPU"), "-"),
        (f"{profile}: production governor (seed 0)", (f"{res.family}, depth {res.metrics()['tree_depth']:.0f}, features "
                                           f"{', '.join(sorted(features_used(res.policy.policy['tree']))) or 'none'}; "
                                           f"{trials} trials, nested outer {outer} trials each; search {t_search:.0f} s CPU"), "-"),
        (f"{profile}: what won and why (the version's description)", " ".join(what), "-"),
        (f"{profile}: held-out tasks: governor regret (expected oracle), seed 0", f"{_pct(g.mean_regret_expected)} {_ci(g.regret_ci)}",
         "<= 0.1 %, no worse than FFG, below paper-mlg"),
        (f"{profile}: held-out tasks: FFG regret", f"{_pct(f.mean_regret_expected)} {_ci(f.regret_ci)}", "-"),
        (f"{profile}: held-out tasks: paper-mlg regret", f"{_pct(pm.mean_regret_expected)} {_ci(pm.regret_ci)}", "-"),
        (f"{profile}: held-out tasks: regret against the measured oracle (governor / FFG / paper-mlg)",
         f"{_pct(g.mean_regret)} / {_pct(f.mean_regret)} / {_pct(pm.mean_regret)}", "-"),
        (f"{profile}: held-out tasks: saving vs maxn (governor / oracle)", f"{_pct(g.mean_saving)} / {_pct(oracle.mean_saving)}", "-"),
    ]
    if seeds > 1:
        rows.append((f"{profile}: held-out tasks, governor regret by seed",
                     " / ".join(f"{_pct(h['governor'].mean_regret_expected)} ({r.family})" for r, h in searches), "-"))
    for split, ns in res.nested.items():
        rows.append((f"{profile}: nested CV on the train workloads, one {split} out (search / FFG / paper-mlg)",
                     (f"{_pct(ns.governor.regret)} {_ci(ns.governor.ci)} / {_pct(ns.ffg.regret)} / {_pct(ns.paper.regret)}; "
                     f"folds chose {', '.join(sorted(set(ns.families)))}"), "-"))
    if lomo is not None:
        rows.append((f"{profile}: leave one model out, all 108 workloads, nested (search / FFG)",
                     f"{_pct(lomo.governor.regret)} {_ci(lomo.governor.ci)} / {_pct(lomo.ffg.regret)}; {t_lomo:.0f} s CPU", "<= 0.3 %"))
    rows.append((f"{profile}: max-slowdown:1.10, same version: bound held on eval workloads",
                 f"n/a ({res.family})" if bound is None else f"{100 * bound:.1f} %", "100 %"))
    rows.append((f"{profile}: max-slowdown:1.10: energy regret (governor / FFG fit for it)",
                 f"{_pct(slow_regret.mean_regret_expected if slow_regret else None)} / {_pct(ffg_slow.mean_regret_expected)}", "-"))
    rows.append((f"{profile}: edp: regret (governor / FFG fit for it)",
                 f"{_pct(edp_regret.mean_regret_expected if edp_regret else None)} / {_pct(ffg_edp.mean_regret_expected)}", "-"))
    if os.environ.get("DVFS_BENCH_ABLATION", "1") != "0":
        rows += flat_curve_rows(ds, energy)
    if os.environ.get("DVFS_BENCH_ADAPTIVE", "1") != "0":
        rows += _adaptive_rows(ds, g.mean_regret_expected, trials, outer)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"governor_quality_{profile}.json").write_text(json.dumps({"rows": rows, "policy": res.policy.policy}, indent=2, default=str))
    return ProfileResult(profile, mean_of["governor"], mean_of["ffg"], mean_of["paper-mlg"], registered, rows)


def flat_curve_rows(ds: Any, objective: Any) -> list[tuple[str, str, str]]:
    """What limits a governor on flat curves, measured on the dataset's training workloads (module doc)."""
    from dvfs_mlops.model.governor.curve_tree import CurveParams
    from dvfs_mlops.model.governor.dataset import with_fitted_curves
    from dvfs_mlops.model.governor.policy_tree import decide, snap
    from dvfs_mlops.model.governor.search import fit_policy

    fitted = with_fitted_curves(ds.split("train"))
    train, check, held = fitted.curves, fitted.fit_check, ds.split("eval").curves
    noise_free = [dataclasses.replace(c, energy_fit_j=dict(c.energy_expected_j), time_fit_s=dict(c.time_expected_s)) for c in train]

    def own(use_fit: bool) -> float:
        return statistics.mean(c.regret(c.label(objective, use_fit), objective) for c in train)

    def median_heldout(curves: list[Any], use_fit: bool, grow_on: str) -> float:
        values = []
        for depth, leaf, split, features in ABLATION_GRID:
            params = CurveParams(max_depth=depth, min_samples_leaf=leaf, min_samples_split=split, features=features,
                                 fitted=use_fit, grow_on=grow_on)
            policy, _ = fit_policy(curves, objective, params, ds.frequencies)
            values.append(statistics.mean(c.regret(snap(decide(policy, c.features.as_row())[0], c.clocks), objective) for c in held))
        return statistics.median(values)

    name = ds.device_profile
    rows = [
        (f"{name}: flat curves: regret of each training workload's own best clock, one draw per clock / the curve model's fit of it",
         f"{_pct(own(False))} / {_pct(own(True))}", "-"),
        (f"{name}: flat curves: the curve model's check, a held-out clock's energy error (rms): model / neighbours' line",
         (f"{_pct(check.model_error)} / {_pct(check.neighbour_error)} over {check.points} clocks; fits "
         f"{'used' if check.model_fits else 'not used'}"), "-"),
    ]
    ways = [("measured, whole curve", train, False, "curve"), ("measured, best clock", train, False, "best-clock"),
            ("curve-model fits, whole curve", train, True, "curve"), ("curve-model fits, best clock", train, True, "best-clock"),
            ("noise-free curves, whole curve", noise_free, True, "curve"), ("noise-free curves, best clock", noise_free, True, "best-clock")]
    rows.append((f"{name}: flat curves: median held-out regret of {len(ABLATION_GRID)} curve trees learnt from "
                 + " / ".join(w[0] for w in ways), " / ".join(_pct(median_heldout(c, u, g)) for _, c, u, g in ways), "-"))
    return rows


def _adaptive_rows(ds: Any, grid_regret: float, trials: int, outer: int) -> list[tuple[str, str, str]]:
    """The same search on the train workloads as an adaptive sweep measures them; judged on the same eval workloads."""
    from dvfs_mlops.mlops.evaluate import evaluate_dataset
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import run_search

    energy = parse_objective("energy")
    ad_curves, ad_clocks = adaptive_curves(ds.curves, ds.frequencies, ds.device_profile)
    ad_ds = dataclasses.replace(ds, curves=ad_curves, sweep_id=f"{ds.sweep_id}-adaptive")
    t0 = time.process_time()
    ad_res = run_search(ad_ds, energy, trials=trials, seed=0, storage="sqlite:///:memory:", outer_trials=outer)
    t_ad = time.process_time() - t0
    ad_held = evaluate_dataset(ds, {"governor": ad_res.policy}, energy, "eval").summaries[0]
    gap = ad_held.mean_regret_expected - grid_regret
    name = ds.device_profile
    what = (f"{name}: governor trained on an adaptive sweep ({ad_clocks:.2f} pinned clocks + maxn per workload, the rest from its "
            "curve fit): held-out regret")
    figure = (f"{_pct(ad_held.mean_regret_expected)} {_ci(ad_held.regret_ci)}; "
              f"{ad_res.family}, depth {ad_res.metrics()['tree_depth']:.0f}; search {t_ad:.0f} s CPU")
    return [(what, figure, "-"),
            (f"{name}: adaptive-sweep governor minus full-grid governor (held-out regret)", f"{100 * gap:+.3f} points", "<= 0.05 points")]


def _trial_held_out(study: Any, seed: int, features: Any, clocks: list[float], train: list[Any], held: list[Any], number: int) -> float:
    """A study's trial refit on the training workloads, its regret on the held-out ones (energy, expected oracle)."""
    import optuna

    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import _params_from_trial, policy_fitter, score

    energy = parse_objective("energy")
    params = _params_from_trial(optuna.trial.FixedTrial(study.trials[number].params), seed, features)
    choose = policy_fitter(energy, params, clocks)(train)
    return score(held, {c.workload: choose(c) for c in held}, energy).regret


def selection_table(profiles: list[str], seeds: int, trials: int) -> str:
    """Why a selection picks a family: per profile and family, over `seeds` selection studies on the 36 training
    workloads, the inner-CV regret of the family's best trial (what the study's best trial is chosen by) against that
    trial's held-out-task regret (expected oracle), and the same for the family's finalist (`choose_family`: ranked over
    repeated splits); then per seed what the study's best trial and `choose_family` register, held out."""
    import collections
    import functools

    from dvfs_mlops.model.governor.dataset import with_fitted_curves
    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import choose_split, search_features, select_with_reasons

    energy = parse_objective("energy")
    lines = [(f"SIMULATED paper preset; {trials} trials per selection study, seeds 0..{seeds - 1}; regrets in %; held out: "
              "the 72 eval-task workloads against the twin's expected oracle"), "",
             "| profile | family | trials | best trial: inner -> held out | chosen trial: inner, repeated splits -> held out |",
             "|---|---|---|---|---|"]
    picks_lines = ["", "| profile | seed | study's best trial (family, held out) | choose_family (family, held out) |", "|---|---|---|---|"]
    for profile in profiles:
        ds = paper_dataset(profile)
        train = with_fitted_curves(ds.split("train")).curves
        held = ds.split("eval").curves
        features = search_features(train)
        per: dict[str, list[tuple[float, ...]]] = collections.defaultdict(list)
        for seed in range(seeds):
            _, study, sel = select_with_reasons(train, energy, ds.frequencies, choose_split(train), trials, seed)
            held_out = functools.partial(_trial_held_out, study, seed, features, ds.frequencies, train, held)

            done = [t for t in study.trials if t.value is not None]
            for family, pick in sel.picks.items():
                best = min((t for t in done if t.params["family"] == family), key=lambda t: (t.value, t.number))
                n = sum(t.params["family"] == family for t in done)
                per[family].append((n, best.value, held_out(best.number), pick.inner.regret, pick.repeated, held_out(pick.trial)))
            top = study.best_trial
            picks_lines.append(f"| {profile} | {seed} | {top.params['family']}, {100 * held_out(top.number):.3f} | "
                               f"{sel.winner}, {100 * held_out(sel.trial):.3f} |")
        for family, rows in sorted(per.items()):
            m = [statistics.mean(r[i] for r in rows) for i in range(6)]
            rescored = [r[4] for r in rows if r[4] == r[4]]  # the seeds where the family won and was re-scored
            repeated = f"{100 * statistics.mean(rescored):.3f} ({len(rescored)} of {len(rows)} seeds)" if rescored else "-"
            lines.append(f"| {profile} | {family} | {m[0]:.0f} | {100 * m[1]:.3f} -> {100 * m[2]:.3f} | "
                         f"{100 * m[3]:.3f}, {repeated} -> {100 * m[5]:.3f} |")
    return "\n".join(lines + picks_lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["selection"]:  # python -m benchmarks.governor_quality selection [PROFILES [SEEDS [TRIALS]]]
        names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["sim-orin-nx-16gb", "sim-orin-measured"]
        text = selection_table(names, int(sys.argv[3]) if len(sys.argv) > 3 else 4, int(sys.argv[4]) if len(sys.argv) > 4 else 60)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "governor_selection.md").write_text(text)
        print(text)
    else:
        for m, v, t in run():
            print(f"{m}: {v} (target {t})")
        print((RESULTS / "governor_table.md").read_text())
