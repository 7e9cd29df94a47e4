"""The family rule of the governor search (`choose_family`): one inner split's best of many trials is optimistic, so the
preferred family (curve) stays unless a rival wins by more than the CV's noise, one fixed clock takes over where it does no
worse, each family's finalist is ranked over repeated splits, and the study, its rebuilt params and the version's
description all say the same choice."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import numpy as np
import optuna
import pytest

from dvfs_mlops.model.governor.dataset import GovernorDataset, WorkloadCurve
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.search import (
    INNER_FOLDS,
    PREFERENCE,
    CVScore,
    _params_from_trial,
    choose_family,
    cross_validate,
    family_of,
    policy_fitter,
    repeated_splits,
    run_search,
    search_features,
    select_with_reasons,
    study_params,
    warm_starts,
)
from dvfs_mlops.model.workload import WorkloadFeatures
from testkit.governor import twin_curves

E = parse_objective("energy")
F = [510.0, 816.0, 1300.5]


@dataclasses.dataclass(frozen=True)
class Trial:
    """What choose_family reads of an Optuna FrozenTrial."""

    number: int
    params: dict[str, Any]
    value: float


def curves() -> list[WorkloadCurve]:
    """Three tasks of four models; shallow models want 510 MHz, deep ones 1300.5."""
    out = []
    for task, seq in (("sst2", 20.0), ("mrpc", 30.0), ("qnli", 60.0)):
        for i, layers in enumerate((2, 4, 12, 24)):
            energy = [10.0, 11.0, 10.6] if layers < 8 else [10.6, 11.0, 10.0]
            out.append(WorkloadCurve(f"m{i}/{task}", "train", WorkloadFeatures("encoder", layers, 256, layers * 1_000_000, seq, 60.0),
                                     dict(zip(F, energy)), dict(zip(F, (1.6, 1.2, 1.0))), 10.6, 1.0))
    return out


CURVES = curves()
WARM = {w["family"] + ("" if w["family"] != "curve" else f"-{w['grow_on']}"): w for w in warm_starts(search_features(CURVES))}


def scored(regrets: list[float]) -> CVScore:
    by = {c.workload: r for c, r in zip(CURVES, regrets)}
    return CVScore(float(np.mean(regrets)), 0.5, {c.workload: 510.0 for c in CURVES}, by)


def pick(known: dict[int, list[float]], trials: list[Trial]) -> Any:
    return choose_family(trials, CURVES, E, F, "task", 0, search_features(CURVES), {n: scored(r) for n, r in known.items()})


def three(curve: list[float], classifier: list[float], fixed: list[float]) -> Any:
    trials = [Trial(0, WARM["fixed"], float(np.mean(fixed))), Trial(1, WARM["curve-best-clock"], float(np.mean(curve))),
              Trial(3, WARM["classifier"], float(np.mean(classifier)))]
    return pick({0: fixed, 1: curve, 3: classifier}, trials)


BASE = [0.01, 0.0, 0.02, 0.0, 0.01, 0.03, 0.0, 0.01, 0.02, 0.0, 0.01, 0.0]


def test_a_classifier_ahead_within_the_cvs_noise_does_not_replace_the_curve_family():
    """The study's best trial is the classifier (one workload better), but the paired interval reaches 0: curve stays."""
    classifier = [*BASE[:5], 0.0, *BASE[6:]]
    sel = three(BASE, classifier, [0.05] * 12)
    assert PREFERENCE[0] == "curve" and sel.incumbent == "curve" and sel.winner == "curve" and sel.trial == 1
    assert sel.picks["classifier"].inner.regret < sel.picks["curve"].inner.regret
    why = sel.why()
    assert "classifier" in why and "within the noise" in why and why.endswith("The curve family won.")


def test_a_rival_that_wins_by_more_than_the_noise_replaces_it():
    sel = three(BASE, [0.0] * 12, [0.05] * 12)  # best on every workload where the curve tree errs
    assert sel.winner == "classifier" and sel.trial == 3
    assert "better beyond the noise" in sel.why() and sel.why().endswith("The classifier family won by more than the noise.")


def test_one_fixed_clock_takes_over_where_it_does_no_worse():
    sel = three(BASE, BASE, list(BASE))
    assert sel.incumbent == "curve" and sel.winner == "fixed" and sel.trial == 0
    assert sel.why().endswith("The fixed family won: one clock for all, no family did better.")


def test_the_fixed_clock_does_not_take_over_where_another_family_does_better():
    """The curve family ties one clock; a classifier does better (within the noise of the curve family): the curve family
    stays, not the clock."""
    classifier = [*BASE[:5], 0.0, *BASE[6:]]
    sel = three(BASE, classifier, list(BASE))
    assert sel.winner == "curve" and "fixed 0." in sel.why() and sel.why().endswith("The curve family won.")


def test_the_winning_familys_configuration_is_the_best_of_its_best_trials_over_repeated_splits():
    """Two curve configurations tie on the inner split; the one with the lower mean over the repeated splits is kept,
    and that mean is the mean of its cross-validations on each split."""
    trials = [Trial(1, WARM["curve-best-clock"], 0.01), Trial(2, WARM["curve-curve"], 0.01), Trial(5, WARM["curve-curve"], 0.01)]
    sel = pick({1: BASE, 2: BASE, 5: BASE}, trials)
    chosen = sel.picks["curve"]
    assert chosen.finalists == 2 and chosen.trial in (1, 2)  # trial 5 repeats trial 2's configuration
    assert repeated_splits(CURVES, "task") == ["task", "workload", "model"]

    def repeated(params: dict[str, Any]) -> float:  # the inner split's score is the one the study kept (BASE)
        p = _params_from_trial(optuna.trial.FixedTrial(params), 0, search_features(CURVES))
        rest = [cross_validate(CURVES, E, policy_fitter(E, p, F), s, INNER_FOLDS).regret for s in ("workload", "model")]
        return statistics.mean([float(np.mean(BASE)), *rest])

    other = 2 if chosen.trial == 1 else 1
    assert chosen.repeated == pytest.approx(repeated(trials[chosen.trial - 1].params))
    assert chosen.repeated <= repeated(trials[other - 1].params)


@pytest.fixture(scope="module")
def twin_train() -> list[WorkloadCurve]:
    return [c for c in twin_curves("sim-orin-nx-16gb", measured=True) if c.split == "train"]


def test_the_study_its_rebuilt_params_and_the_selection_agree(twin_train):
    freqs = sorted(twin_train[0].energy_j)
    params, study, sel = select_with_reasons(twin_train, E, freqs, "task", 12, 0)
    assert study.user_attrs["selected_trial"] == sel.trial and study.user_attrs["selection"] == sel.why()
    assert study_params(study, twin_train) == params and family_of(params) == sel.winner
    assert set(sel.picks) == {t.params["family"] for t in study.trials}


def test_the_version_says_which_family_won_and_why():
    res = run_search(GovernorDataset(CURVES, F, "sw", "sim-orin", False), E, trials=6, outer_trials=2, outer_splits=())
    assert res.selection is not None and res.search_params == study_params(res.study, CURVES)
    text = res.description()
    assert f"Which family: {res.selection.why()}" in text and "The curve family is preferred" in text
