"""Governor: labels per objective, LOOCV by hand, policies, the published tree."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops.dataset import dataset_from_frame
from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.policies import FixedPolicy, MaxNPolicy, TreePolicy, paper_tree
from dvfs_mlops.model.governor.search import ffg_fitter, paper_score
from dvfs_mlops.model.workload import WorkloadFeatures
from testkit.governor import loocv

F = [306.0, 612.0, 1020.0]


def curve(name, energy, time, maxn_e, maxn_t, layers=6, seq=20.0, util=50.0, split="train"):
    return WorkloadCurve(name, split, WorkloadFeatures("encoder", layers, 256, 10_000_000, seq, util),
                         dict(zip(F, energy)), dict(zip(F, time)), maxn_e, maxn_t)


# E:   306  612  1020      T:  306  612  1020
A = curve("a/sst2", [10, 8, 9], [3.0, 1.5, 1.0], 9.5, 1.0)
B = curve("b/sst2", [12, 11, 10], [3.0, 1.6, 1.0], 10.0, 1.0)


def test_labels_per_objective():
    assert A.label(parse_objective("energy")) == 612.0
    assert A.label(parse_objective("edp")) == 1020.0  # 10*3=30, 8*1.5=12, 9*1=9
    assert A.label(parse_objective("max-slowdown:1.2")) == 1020.0  # only 1020 is within 1.2 x maxn time
    assert A.label(parse_objective("max-slowdown:1.6")) == 612.0
    assert B.label(parse_objective("energy")) == 1020.0


def test_regret_by_hand():
    e = parse_objective("energy")
    assert A.regret(612.0, e) == 0.0
    assert A.regret(306.0, e) == pytest.approx(10 / 8 - 1)
    assert A.regret(1020.0, parse_objective("edp")) == 0.0
    # an infeasible clock under max-slowdown is charged twice the worst feasible cost
    assert A.regret(306.0, parse_objective("max-slowdown:1.2")) == pytest.approx(2 * 9 / 9 - 1)


def test_bad_objectives():
    for bad in ("power", "max-slowdown:0.5", "max-slowdown:x"):
        with pytest.raises(DvfsError):
            parse_objective(bad)


def test_ffg_picks_least_mean_normalised_energy():
    # E/E_min per workload: A 1.25, 1, 1.125; B 1.2, 1.1, 1 -> sums 2.45, 2.1, 2.125 -> 612
    # (on total joules it would be 1020: 22, 19, 19 -> a tie broken upwards; B's larger joules would decide it)
    assert FixedPolicy.fit([A, B], parse_objective("energy")).freq_mhz == 612.0
    big = curve("big/sst2", [100, 120, 90], [3.0, 1.5, 1.0], 100.0, 1.0)  # 10x the joules, wants 1020 by 11 %
    # normalised: A+B+big 306: 2.45+1.111, 612: 2.1+1.333, 1020: 2.125+1 -> 1020 (3.125 < 3.433 < 3.561)
    assert FixedPolicy.fit([A, B, big], parse_objective("energy")).freq_mhz == 1020.0
    small = [curve(f"s{i}/sst2", [10, 8, 9], [3.0, 1.5, 1.0], 9.5, 1.0) for i in range(3)]  # 3 small ones want 612 by 12.5 %
    assert FixedPolicy.fit([*small, big], parse_objective("energy")).freq_mhz == 612.0  # on joules big would win (2 * 9 + 90 vs ...)


def test_loocv_by_hand_on_tiny_case():
    """Three workloads; FFG fit on the other two, scored on the held-out one."""
    C = curve("c/sst2", [5, 4, 6], [2.0, 1.0, 0.8], 5.5, 0.8)
    e = parse_objective("energy")
    s = loocv([A, B, C], e, ffg_fitter(e, F))
    # normalised (E/E_min): A 1.25 1 1.125, B 1.2 1.1 1, C 1.25 1 1.5
    # hold A: B+C 306:2.45 612:2.1 1020:2.5 -> 612, A's regret 0, hit (A's label 612)
    # hold B: A+C 306:2.5 612:2 1020:2.625 -> 612, B regret 11/10-1 = 0.1, miss
    # hold C: A+B 306:2.45 612:2.1 1020:2.125 -> 612, C regret 0, hit
    assert s.choices == {"a/sst2": 612.0, "b/sst2": 612.0, "c/sst2": 612.0}
    assert s.regret == pytest.approx(0.1 / 3)
    assert s.accuracy == pytest.approx(2 / 3)


def test_published_tree_decisions():
    t = paper_tree()
    table = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]

    def f(layers, seq, util):
        return WorkloadFeatures("encoder", layers, 768, 1, seq, util)

    assert t.choose(f(4, 20, 60), table) == 510.0
    assert t.choose(f(4, 40, 60), table) == 612.0
    assert t.choose(f(12, 40, 60), table) == 714.0
    assert t.choose(f(12, 71.3, 60), table) == 816.0
    assert t.choose(f(24, 71.3, 15), table) == 1020.0  # the GPU-utilisation split sits at the root
    assert t.explain(f(12, 71.3, 95), table) == "gpu_util_pct=95 > 22, num_layers=12 > 7, avg_seq_len=71.3 > 53 -> 816 MHz"


def test_paper_score_uses_the_same_curves():
    s = paper_score([A, B], parse_objective("energy"), F)
    # both: util 50 > 22, layers 6 <= 7, seq 20 <= 32.5 -> 510 -> snapped to 612 on this table
    assert s.choices == {"a/sst2": 612.0, "b/sst2": 612.0}
    assert s.regret == pytest.approx((0 + 0.1) / 2)


def test_tree_from_sklearn_roundtrip():
    import numpy as np
    from sklearn.tree import DecisionTreeClassifier

    X = np.array([[2.0], [4.0], [12.0], [24.0]])
    y = np.array([510.0, 510.0, 816.0, 816.0])
    clf = DecisionTreeClassifier(random_state=0).fit(X, y)
    t = TreePolicy.from_sklearn(clf, ["num_layers"])
    assert t.policy["tree"]["feature"] == "num_layers" and t.policy["tree"]["threshold"] == pytest.approx(8.0)
    assert t.choose({"num_layers": 6}) == 510.0 and t.choose({"num_layers": 16}) == 816.0


def test_maxn_policy():
    assert MaxNPolicy().choose(None) == "maxn"


def _frame(rows):
    return pd.DataFrame(rows)


def _row(model, task, freq, energy, time, util=40.0, acc=0.8):
    return {"params.model": model, "params.task": task, "params.freq_mhz": freq, "params.model_type": "encoder",
            "params.num_layers": "2", "params.hidden_size": "128", "params.num_params": "4000000", "params.avg_seq_len": "13.0",
            "params.split": "train", "params.repeat": "0", "metrics.energy_j": energy, "metrics.time_s": time,
            "metrics.gpu_util_pct": util, "metrics.eval_accuracy": acc}


def test_dataset_from_runs_means_repeats_and_takes_util_at_maxn():
    rows = [_row("m", "sst2", "maxn", 9.0, 1.0, util=33.0), _row("m", "sst2", "306", 10.0, 3.0, util=90.0),
            _row("m", "sst2", "612", 8.0, 1.5), _row("m", "sst2", "612", 6.0, 1.5)]
    ds = dataset_from_frame(_frame(rows))
    c = ds.curves[0]
    assert ds.frequencies == [306.0, 612.0] and c.energy_j == {306.0: 10.0, 612.0: 7.0}
    assert c.features.gpu_util_pct == 33.0 and c.maxn_energy_j == 9.0 and c.label(parse_objective("energy")) == 612.0


def test_dataset_names_unusable_workloads_only():
    """No maxn (no gpu_util_pct, no slowdown reference) is unusable; a missing pinned clock is not."""
    rows = [_row("m", "sst2", "maxn", 9.0, 1.0), _row("m", "sst2", "306", 10.0, 3.0), _row("m", "sst2", "612", 8.0, 1.5),
            _row("n", "sst2", "306", 10.0, 3.0), _row("o", "sst2", "maxn", 9.0, 1.0)]
    with pytest.raises(DvfsError, match=r"2 unusable workload\(s\), missing: n/sst2@maxn, o/sst2@\(any pinned clock\)"):
        dataset_from_frame(_frame(rows), "sw1")


def test_partial_sweep_is_valid_and_policies_choose_among_measured_clocks():
    rows = [_row("m", "sst2", "maxn", 9.0, 1.0), _row("m", "sst2", "306", 10.0, 3.0), _row("m", "sst2", "612", 8.0, 1.5),
            _row("m", "sst2", "1020", 9.0, 1.0), _row("n", "sst2", "maxn", 9.0, 1.0), _row("n", "sst2", "306", 12.0, 3.0),
            _row("n", "sst2", "1020", 10.0, 1.0)]
    ds = dataset_from_frame(_frame(rows), "sw1")
    n = ds.curves[1]
    assert ds.frequencies == F and n.clocks == [306.0, 1020.0]
    e = parse_objective("energy")
    # a clock this workload did not measure is judged at the nearest one it did
    assert n.regret(612.0, e) == pytest.approx(12 / 10 - 1) and n.regret(900.0, e) == 0.0
    assert FixedPolicy.fit(ds.curves, e).freq_mhz in F


def test_too_few_workloads_for_loocv():
    from dvfs_mlops.model.governor.dataset import GovernorDataset
    from dvfs_mlops.model.governor.search import run_search

    ds = GovernorDataset([A, B], F, "sw", "sim-orin", True)
    with pytest.raises(DvfsError, match="cross-validation needs at least 4"):
        run_search(ds, parse_objective("energy"), trials=1, storage="sqlite:///:memory:")


def test_search_beats_or_matches_baselines_on_structured_data(tmp_path):
    """Deep models want 816, shallow ones 510: a tree finds it, FFG cannot."""
    from dvfs_mlops.model.governor.dataset import GovernorDataset
    from dvfs_mlops.model.governor.search import run_search

    freqs = [510.0, 816.0]
    curves = []
    for i, layers in enumerate([2, 4, 6, 12, 16, 24]):
        deep = layers > 7
        e = {510.0: 10.0 if not deep else 12.0, 816.0: 11.0 if not deep else 10.0}
        curves.append(WorkloadCurve(f"m{i}/sst2", "train", WorkloadFeatures("encoder", layers, 256, 1, 20.0, 50.0),
                                    e, {510.0: 1.5, 816.0: 1.0}, 11.0, 1.0))
    res = run_search(GovernorDataset(curves, freqs, "sw", "sim-orin", True), parse_objective("energy"), trials=15,
                     storage=f"sqlite:///{tmp_path}/o.db", outer_trials=4, outer_splits=())
    assert res.tree.regret == 0.0 and res.tree.accuracy == 1.0
    assert res.ffg.regret > 0.0 and math.isclose(res.ffg.accuracy, 0.5)
    assert res.policy.choose({"model_type": "encoder", "num_layers": 20, "hidden_size": 1, "num_params": 1,
                              "avg_seq_len": 1, "gpu_util_pct": 1}) == 816.0


def test_classifier_learns_a_fractional_clock_label():
    """1300.5 MHz as a best clock: sklearn must see clock classes, not a continuous target."""
    from dvfs_mlops.model.governor.search import TreeParams, fit_policy

    clocks = [306.0, 612.0, 1300.5]
    fast = [WorkloadCurve(f"big{i}/sst2", "train", WorkloadFeatures("encoder", 24, 1024, 300_000_000, 60.0, 99.0),
                          dict(zip(clocks, [30.0, 20.0, 10.0])), dict(zip(clocks, [4.0, 2.0, 1.0])), 10.5, 1.0) for i in range(3)]
    slow = [WorkloadCurve(f"small{i}/sst2", "train", WorkloadFeatures("encoder", 2, 128, 4_000_000, 20.0, 20.0),
                          dict(zip(clocks, [5.0, 8.0, 12.0])), dict(zip(clocks, [3.0, 1.6, 1.0])), 12.5, 1.0) for i in range(3)]
    params = TreeParams(features=("num_layers",), max_depth=2)
    policy, _ = fit_policy(fast + slow, parse_objective("energy"), params, clocks)
    t = TreePolicy(policy, "governor")
    assert t.choose(fast[0].features.as_row()) == 1300.5 and t.choose(slow[0].features.as_row()) == 306.0
