"""Curve governor, truth against expected curves, nested CV with three splits, and gates that fail."""
from __future__ import annotations

import types

import pytest

from dvfs_mlops.model.governor import policy_tree
from dvfs_mlops.model.governor.curve_tree import CurveParams, fit_curve_policy
from dvfs_mlops.model.governor.dataset import GovernorDataset, WorkloadCurve
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.policies import OraclePolicy
from dvfs_mlops.model.governor.search import bootstrap_ci, folds, run_search
from dvfs_mlops.model.workload import WorkloadFeatures

F = [510.0, 816.0, 1300.5]
E = parse_objective("energy")


def wl(model: str, task: str, layers: int, energy, time, maxn_t=1.0, split="train", seq=20.0, **kw) -> WorkloadCurve:
    return WorkloadCurve(f"{model}/{task}", split, WorkloadFeatures("encoder", layers, 256, layers * 1_000_000, seq, 60.0),
                         dict(zip(F, map(float, energy))), dict(zip(F, map(float, time))), float(max(energy)), maxn_t, **kw)


def structured(n_models=4, tasks=("sst2", "mrpc", "qnli")) -> list[WorkloadCurve]:
    """Shallow models want 510 MHz, deep ones 816: the feature (num_layers) decides; sizes differ 10x."""
    out = []
    for i in range(n_models):
        layers = [2, 4, 12, 24][i % 4]
        scale = 1.0 + 9.0 * i
        for j, t in enumerate(tasks):
            e = [10, 11, 12] if layers < 8 else [12, 10, 11]
            out.append(wl(f"m{i}", t, layers, [scale * (v + 0.01 * j) for v in e], [1.6, 1.2, 1.0]))
    return out


# -- the curve policy: one version, every objective -------------------------------------------------------------------
POLICY = {"format": policy_tree.FORMAT, "family": "curve", "objective": "energy", "clocks_mhz": F,
          "tree": {"feature": "num_layers", "threshold": 7,
                   "left": {"energy": [1.0, 1.05, 1.2], "time": [1.8, 1.3, 1.0], "time_hi": [1.9, 1.35, 1.0], "samples": 3},
                   "right": {"energy": [1.1, 1.0, 1.02], "time": [1.5, 1.08, 1.0], "time_hi": [1.6, 1.12, 1.0], "samples": 2}}}


def test_curve_policy_applies_the_objective_at_decision_time():
    shallow, deep = {"num_layers": 2}, {"num_layers": 12}
    assert policy_tree.decide(POLICY, shallow)[0] == 510.0  # least normalised energy
    assert policy_tree.decide(POLICY, deep)[0] == 816.0
    assert policy_tree.decide(POLICY, shallow, "edp")[0] == 1300.5  # 1.8, 1.365, 1.2
    assert policy_tree.decide(POLICY, shallow, "max-slowdown:1.4")[0] == 816.0  # time_hi 1.35 <= 1.4
    assert policy_tree.decide(POLICY, deep, "max-slowdown:1.10")[0] == 1300.5  # time_hi 1.12 > 1.10: the bound wins
    assert policy_tree.decide(POLICY, deep, "max-slowdown:1.01")[0] == 1300.5
    _, path = policy_tree.decide(POLICY, deep)
    assert path[0] == "num_layers=12 > 7" and "leaf curve (2 workloads) at 816 MHz: E/Emin 1.000, T/Tmaxn 1.080" in path[1]
    out = policy_tree.decide_rows(POLICY, [shallow, deep], table=[510.0, 800.0, 1300.5], objective="energy")
    assert out["freq_mhz"] == [510.0, 800.0]


def test_a_classifier_refuses_another_objective_and_a_bad_one_is_named():
    clf = {"format": policy_tree.FORMAT, "objective": "energy", "tree": {"freq_mhz": 612.0}}
    assert policy_tree.decide_rows(clf, [{}], objective="energy")["freq_mhz"] == [612.0]
    with pytest.raises(ValueError, match="objective 'energy' only"):
        policy_tree.decide_rows(clf, [{}], objective="edp")
    with pytest.raises(ValueError, match="unknown objective 'power'"):
        policy_tree.decide(POLICY, {"num_layers": 2}, "power")


def test_fit_curve_policy_leaves_hold_the_mean_normalised_curves():
    curves = structured(n_models=4, tasks=("sst2",))
    policy, _ = fit_curve_policy(curves, F, CurveParams(max_depth=1, min_samples_leaf=1))
    assert policy["tree"]["feature"] in ("num_layers", "num_params")  # the only features that separate the two shapes
    left = policy["tree"]["left"]
    assert left["samples"] == 2 and left["energy"] == pytest.approx([1.0, 1.1, 1.2]) and left["time_hi"] == [1.6, 1.2, 1.0]
    constant, _ = fit_curve_policy(curves, F, CurveParams(max_depth=0))
    assert policy_tree.tree_depth(constant["tree"]) == 0 and not policy_tree.features_used(constant["tree"])
    # a partial sweep: a workload without 816 still trains; the leaf mean at 816 uses the workloads that measured it
    part = [*curves[:3], wl("m9", "sst2", 24, [12, 11], [1.6, 1.0])]
    part[-1].energy_j, part[-1].time_s = {510.0: 12.0, 1300.5: 11.0}, {510.0: 1.6, 1300.5: 1.0}
    p2, _ = fit_curve_policy(part, F, CurveParams(max_depth=1, min_samples_leaf=1))
    deep = p2["tree"]["right"]
    assert deep["samples"] == 2 and deep["energy"][1] == pytest.approx(1.0)  # only m2's 816 point, not an interpolation


# -- truth: expected curves where logged --------------------------------------------------------------------------------
def test_regret_is_judged_against_the_expected_curve_where_logged():
    # the measured draw says 510 is best; the noise-free curve says 816
    c = wl("m", "sst2", 4, [9.8, 10.0, 11.0], [1.6, 1.2, 1.0], energy_expected_j={510.0: 10.2, 816.0: 10.0, 1300.5: 11.0},
           time_expected_s={510.0: 1.6, 816.0: 1.2, 1300.5: 1.0}, maxn_energy_expected_j=11.0, maxn_time_expected_s=1.0)
    assert c.has_expected and c.label(E) == 510.0 and c.true_label(E) == 816.0
    assert c.regret(816.0, E) == 0.0 and c.regret(510.0, E) == pytest.approx(0.02)
    assert c.regret_measured(816.0, E) == pytest.approx(10.0 / 9.8 - 1)
    assert OraclePolicy(E).choose_for(c) == 816.0
    plain = wl("n", "sst2", 4, [9.8, 10.0, 11.0], [1.6, 1.2, 1.0])
    assert not plain.has_expected and plain.regret(510.0, E) == 0.0  # hardware: the mean over repeats is the truth


# -- nested cross-validation --------------------------------------------------------------------------------------------
def test_folds_hold_out_whole_groups():
    curves = structured()
    by_task = folds(curves, "task")
    assert len(by_task) == 3 and all(len({curves[i].task for i in f}) == 1 for f in by_task)
    by_model = folds(curves, "model", k=2)
    assert len(by_model) == 2 and not {curves[i].model for i in by_model[0]} & {curves[i].model for i in by_model[1]}


def test_bootstrap_interval_brackets_the_mean():
    lo, hi = bootstrap_ci([0.0, 0.01, 0.02, 0.0, 0.05])
    assert 0.0 <= lo < 0.016 < hi <= 0.05
    assert bootstrap_ci([0.01]) == (0.01, 0.01)


def test_nested_cv_reports_three_splits_and_no_study_leaks(tmp_path):
    ds = GovernorDataset(structured(), F, "sw", "sim-orin", True)
    storage = f"sqlite:///{tmp_path}/o.db"
    a = run_search(ds, E, trials=3, storage=storage, outer_trials=3)
    assert a.split == "task" and set(a.nested) == {"task", "workload", "model"}
    assert a.nested["task"].n_groups == 3 and a.nested["model"].n_groups == 4
    assert a.heldout.governor.regret < a.heldout.ffg.regret  # features matter here, and the governor learns them
    assert a.features_matter and a.metrics()["n_features_used"] >= 1
    # a re-run gets a fresh study: more selection trials there change nothing of the held-out figure
    b = run_search(ds, E, trials=6, storage=storage, outer_trials=3)
    assert b.study_name != a.study_name and len(b.study.trials) == 6
    assert b.heldout.governor.regrets == a.heldout.governor.regrets
    # joining a study by name is deliberate, and adds to it
    c = run_search(ds, E, trials=2, storage=storage, study_name=a.study_name, outer_trials=3, outer_splits=())
    assert c.study_name == a.study_name and len(c.study.trials) == 5


# -- gates ---------------------------------------------------------------------------------------------------------------
GOOD = {"tree_outer_regret": 0.001, "tree_outer_regret_ci_high": 0.003, "ffg_outer_regret": 0.02, "n_features_used": 2.0,
        "features_matter": 1.0, "tree_minus_ffg_outer_regret_ci_low": -0.025, "tree_minus_ffg_outer_regret_ci_high": -0.012}


class StubClient:
    """The two calls check_gates makes: a version's run metrics, and the production alias."""

    def __init__(self, runs: dict[str, dict[str, float]], production: str | None = None):
        self.runs, self.production = runs, production

    def get_run(self, run_id):
        return types.SimpleNamespace(data=types.SimpleNamespace(metrics=self.runs[run_id]))

    def get_model_version_by_alias(self, name, alias):
        if self.production is None:
            raise LookupError(alias)
        return types.SimpleNamespace(version=self.production, run_id=self.production, tags={})


def _gates(metrics: dict[str, float], production: dict[str, float] | None = None) -> dict[str, bool | None]:
    from dvfs_mlops.mlops.registry import check_gates, load_config

    runs = {"cand": metrics, **({"prod": production} if production else {})}
    cand = types.SimpleNamespace(version="cand", run_id="cand", tags={})
    return {g.name: g.passed for g in check_gates(StubClient(runs, "prod" if production else None), load_config(), cand)}


def test_every_gate_passes_a_good_version():
    assert _gates(GOOD, production={**GOOD, "tree_outer_regret": 0.002}) == {
        "regret-no-worse-than-production": True, "heldout-regret": True, "beats-ffg": True, "uses-features": True}


@pytest.mark.parametrize("change, production, gate", [
    ({"tree_outer_regret": 0.004}, {**GOOD, "tree_outer_regret": 0.003}, "regret-no-worse-than-production"),
    ({"tree_outer_regret_ci_high": 0.05}, None, "heldout-regret"),
    # worse than FFG by more than the CV's noise: even the low end of the paired interval is above 0
    ({"tree_minus_ffg_outer_regret_ci_low": 0.0005, "tree_minus_ffg_outer_regret_ci_high": 0.004}, None, "beats-ffg"),
    ({"n_features_used": 0.0}, None, "uses-features"),  # a constant version where features matter
    ({"tree_minus_ffg_outer_regret_ci_low": None}, None, "beats-ffg"),  # a version without the figure is not promotable
])
def test_each_gate_fails(change, production, gate):
    m = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    assert _gates(m, production)[gate] is False


def test_a_version_that_ties_ffg_within_the_noise_passes():
    """FFG's own clock (the floor) and a tree a hair worse than FFG whose interval holds 0 both pass beats-ffg; with no
    feature that matters a fixed clock passes uses-features as not applicable."""
    fixed = {**GOOD, "tree_outer_regret": 0.012, "tree_outer_regret_ci_high": 0.018, "ffg_outer_regret": 0.012,
             "n_features_used": 0.0, "features_matter": 0.0,
             "tree_minus_ffg_outer_regret_ci_low": 0.0, "tree_minus_ffg_outer_regret_ci_high": 0.0}
    assert _gates(fixed) == {"regret-no-worse-than-production": None, "heldout-regret": True, "beats-ffg": True,
                             "uses-features": None}
    hair = {**GOOD, "tree_outer_regret": 0.0152, "tree_outer_regret_ci_high": 0.019, "ffg_outer_regret": 0.015, "tree_minus_ffg_outer_regret_ci_low": -0.0004, "tree_minus_ffg_outer_regret_ci_high": 0.0006}
    assert _gates(hair)["beats-ffg"] is True


def test_a_constant_version_is_fine_where_features_do_not_matter():
    assert _gates({**GOOD, "n_features_used": 0.0, "features_matter": 0.0})["uses-features"] is None
