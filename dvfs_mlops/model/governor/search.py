"""Optuna over governor families and hyper-parameters, with nested cross-validation for the reported score.

Four families of candidate: `curve` (a regression tree whose leaves hold normalised energy/time curves,
`curve_tree.py`), `classifier` (a DecisionTreeClassifier on each workload's best clock), `fixed` (one clock for
every workload, FFG's rule: a depth-0 governor) and `published` (the study's tree, registry/baselines/paper-mlg.json,
as it is). The trees learn from the curve model's fits of the measured curves where the model describes the board
(dataset.with_fitted_curves checks it), which on flat curves is what separates the best clock from the noise, and from
the measured curves elsewhere. Optuna searches the families and their hyper-parameters by inner cross-validation regret
(judged against the truth: the twin's expected curve where logged, else the mean over repeats), and `choose_family`
picks from its trials: one inner split's best of many trials is optimistic, most for the family with the most trials and
knobs, so the curve family is kept unless a rival wins by more than the CV's noise (a paired bootstrap over workloads) or
one fixed clock does no worse than any family, and the winning family's best trials are re-scored over repeated splits.

The reported score is nested: for every outer fold (leave one workload, task or model out) a fresh
in-memory study selects on the outer fold's training workloads only, and the held-out group is then
scored. So neither this study nor an older one can leak selection into the reported figure. The
production study is fresh per training request unless `study_name` joins one on purpose.

The fixed clock is the floor: where the search's held-out regret (nested, on the split the gates read) is not below
FFG's, the version registered is FFG's clock, not the search's choice (`SearchResult.floored`), so a version is never
worse than one fixed clock on the held-out folds. `SearchResult.description()` says which family won and why.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.model.governor import policy_tree
from dvfs_mlops.model.governor.curve_tree import (
    GROW_ON,
    CurveParams,
    best_clock,
    feature_array,
    feature_row,
    fit_curve_policy,
    kept,
)
from dvfs_mlops.model.governor.dataset import (
    NUMERIC_FEATURES,
    FitCheck,
    GovernorDataset,
    WorkloadCurve,
    with_fitted_curves,
)
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.governor.policies import FixedPolicy, TreePolicy, paper_tree

if TYPE_CHECKING:
    import optuna

MIN_WORKLOADS = 4
SPLITS = ("workload", "task", "model")
INNER_FOLDS = 5
FAMILIES = ("curve", "classifier", "fixed", "published")  # the candidates the selection study chooses among
Chooser = Callable[[WorkloadCurve], float]
Fitter = Callable[[Sequence[WorkloadCurve]], Chooser]


def group_of(curve: WorkloadCurve, split: str) -> str:
    return {"workload": curve.workload, "task": curve.task, "model": curve.model}[split]


def bootstrap_ci(values: Sequence[float], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95 % percentile interval of the mean, resampling workloads (for a paired difference: the per-workload
    differences of two policies scored on the same workloads)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        m = float(v.mean()) if len(v) else math.nan
        return m, m
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n, len(v)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


@dataclasses.dataclass(frozen=True)
class CVScore:
    """A policy's score on held-out workloads.

    Attributes:
        regret: the mean regret over the held-out workloads, against the truth (the twin's expected curve where
            logged, else the mean over repeats).
        accuracy: the share of held-out workloads whose true best clock was chosen.
        choices: workload -> the clock chosen.
        regrets: workload -> its regret.
        ci: (property) the bootstrap 95 % interval of the mean regret, resampling workloads.
    """

    regret: float  # mean over held-out workloads, against the truth
    accuracy: float  # share of held-out workloads whose true best clock was hit
    choices: dict[str, float]  # workload -> chosen clock
    regrets: dict[str, float] = dataclasses.field(default_factory=dict)  # workload -> regret

    @property
    def ci(self) -> tuple[float, float]:
        return bootstrap_ci(list(self.regrets.values()))

    def as_metrics(self, prefix: str) -> dict[str, float]:
        lo, hi = self.ci
        return {f"{prefix}_regret": self.regret, f"{prefix}_regret_ci_low": lo, f"{prefix}_regret_ci_high": hi,
                f"{prefix}_accuracy": self.accuracy}

    def minus(self, other: CVScore) -> tuple[float, float, float]:
        """(mean, 95 % low, 95 % high) of this score's regret minus `other`'s on the same workloads: a paired bootstrap
        over workloads, so what both policies find hard cancels and the interval is the noise of the difference."""
        diffs = [self.regrets[w] - other.regrets[w] for w in self.regrets if w in other.regrets]
        if not diffs:
            return math.nan, math.nan, math.nan
        lo, hi = bootstrap_ci(diffs)
        return float(np.mean(diffs)), lo, hi


def _truth(curve: WorkloadCurve, objective: Objective) -> tuple[float, dict[float, float]]:
    """(the true best clock, regret at each measured clock), kept per curve."""
    def make() -> tuple[float, dict[float, float]]:
        return curve.true_label(objective), {f: curve.regret(f, objective) for f in curve.energy_j}

    return kept(curve, ("truth", objective), make)  # type: ignore[no-any-return]


def score(curves: Sequence[WorkloadCurve], choices: dict[str, float], objective: Objective) -> CVScore:
    """A policy's choices judged against the truth (`WorkloadCurve.regret`, `true_label`), per workload."""
    truths = {c.workload: _truth(c, objective) for c in curves}
    regrets = {c.workload: truths[c.workload][1][c.nearest(choices[c.workload])] for c in curves}
    hits = [c.nearest(choices[c.workload]) == truths[c.workload][0] for c in curves]
    return CVScore(float(np.mean(list(regrets.values()))), float(np.mean(hits)), choices, regrets)


def folds(curves: Sequence[WorkloadCurve], split: str, k: int | None = None) -> list[list[int]]:
    """Held-out index sets: one group per fold, or (k given, more groups than k) groups dealt round k folds."""
    groups = sorted({group_of(c, split) for c in curves})
    if k is not None and len(groups) > k:
        assign = {g: i % k for i, g in enumerate(groups)}
        return [[i for i, c in enumerate(curves) if assign[group_of(c, split)] == j] for j in range(k)]
    return [[i for i, c in enumerate(curves) if group_of(c, split) == g] for g in groups]


def cross_validate(curves: Sequence[WorkloadCurve], objective: Objective, fit: Fitter, split: str = "workload",
                   k: int | None = None) -> CVScore:
    """Fit on all but one fold, choose for the held-out fold, for every fold."""
    choices: dict[str, float] = {}
    for held in folds(curves, split, k):
        hs = set(held)
        choose = fit([c for i, c in enumerate(curves) if i not in hs])
        for i in held:
            choices[curves[i].workload] = choose(curves[i])
    return score(curves, choices, objective)


@dataclasses.dataclass(frozen=True)
class TreeParams:
    criterion: str = "gini"
    max_depth: int | None = 3
    min_samples_split: int = 2
    min_samples_leaf: int = 1
    max_features: float | None = None
    ccp_alpha: float = 0.0
    class_weight: str | None = None
    features: tuple[str, ...] = NUMERIC_FEATURES
    seed: int = 0
    fitted: bool = True  # learn each workload's best clock on its curve-model fit where it has one

    def classifier(self) -> Any:
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(criterion=self.criterion, max_depth=self.max_depth, min_samples_split=self.min_samples_split,
                                      min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
                                      ccp_alpha=self.ccp_alpha, class_weight=self.class_weight, random_state=self.seed)


@dataclasses.dataclass(frozen=True)
class FixedParams:
    """One clock for every workload: FFG's (`FixedPolicy.fit`, least mean normalised cost) on the training workloads.

    A depth-0 governor; it reads no feature."""

    features: tuple[str, ...] = ()
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class PublishedParams:
    """The published tree (registry/baselines/paper-mlg.json) as it is: nothing is fitted.

    Attributes:
        features: the features the tree splits on (`published_features`).
    """

    features: tuple[str, ...] = ()
    seed: int = 0


GovernorParams = TreeParams | CurveParams | FixedParams | PublishedParams


def family_of(params: GovernorParams) -> str:
    """curve, classifier, fixed or published."""
    if isinstance(params, CurveParams):
        return "curve"
    if isinstance(params, FixedParams):
        return "fixed"
    if isinstance(params, PublishedParams):
        return "published"
    return "classifier"


def published_features() -> tuple[str, ...]:
    """The features the published tree splits on, sorted."""
    return tuple(sorted(policy_tree.features_used(paper_tree().policy["tree"])))


def fit_tree(curves: Sequence[WorkloadCurve], objective: Objective, params: TreeParams) -> Any:
    clf = params.classifier()
    # clocks as class names: sklearn takes float labels such as 1300.5 for a regression target
    labels = [f"{best_clock(c, objective, params.fitted):g}" for c in curves]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(feature_array(curves, params.features), np.asarray(labels), check_input=False)
    return clf


def fit_policy(curves: Sequence[WorkloadCurve], objective: Objective, params: GovernorParams, clocks: Sequence[float],
               metadata: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """(policy.json dict, the sklearn estimator or None) of one family; every decision then goes through policy_tree.

    A fixed clock is a one-leaf tree holding FFG's clock; the published tree is paper-mlg.json's tree under this
    version's metadata (its `source` and `note` kept, `baseline` naming it)."""
    meta = {"objective": objective.name, **(metadata or {})}
    if isinstance(params, CurveParams):
        return fit_curve_policy(curves, clocks, params, meta, objective)
    if isinstance(params, FixedParams):
        clock = FixedPolicy.fit(curves, objective).freq_mhz
        return {"format": policy_tree.FORMAT, **meta, "family": "fixed", "tree": {"freq_mhz": clock, "samples": len(curves)}}, None
    if isinstance(params, PublishedParams):
        published = paper_tree().policy
        return {**published, **meta, "family": "published", "baseline": published.get("name", "paper-mlg"), "tree": published["tree"]}, None
    clf = fit_tree(curves, objective, params)
    return TreePolicy.from_sklearn(clf, list(params.features), {"family": "classifier", **meta}).policy, clf


def policy_fitter(objective: Objective, params: GovernorParams, clocks: Sequence[float]) -> Fitter:
    def fit(train: Sequence[WorkloadCurve]) -> Chooser:
        policy, _ = fit_policy(train, objective, params, clocks)
        return lambda c: policy_tree.snap(policy_tree.decide(policy, feature_row(c.features))[0], c.clocks)

    return fit


def ffg_fitter(objective: Objective, frequencies: Sequence[float]) -> Fitter:
    def fit(train: Sequence[WorkloadCurve]) -> Chooser:
        f = FixedPolicy.fit(train, objective).freq_mhz
        return lambda c: policy_tree.snap(f, c.clocks)

    return fit


def paper_score(curves: Sequence[WorkloadCurve], objective: Objective, frequencies: Sequence[float]) -> CVScore:
    """The published tree needs no fitting: every workload is already 'held out'."""
    tree = paper_tree()
    return score(curves, {c.workload: float(tree.choose(c.features, c.clocks or frequencies)) for c in curves}, objective)


# Features that only some sweeps vary (LoRA vs full fine-tuning, 16-bit vs fp32): offered to the search only where they
# do, so a sweep of full fp32 fine-tunes searches only the other NUMERIC_FEATURES.
OPTIONAL_FEATURES = ("trainable_params", "half_precision")


def search_features(curves: Sequence[WorkloadCurve]) -> tuple[str, ...]:
    """NUMERIC_FEATURES minus the optional ones that carry nothing here (trainable_params equal to num_params everywhere,
    one precision for every workload)."""
    rows = [c.features.numeric_row() for c in curves]

    def informative(f: str) -> bool:
        if f == "trainable_params":
            return any(r["trainable_params"] != r["num_params"] for r in rows)
        return len({r[f] for r in rows}) > 1

    return tuple(f for f in NUMERIC_FEATURES if f not in OPTIONAL_FEATURES or informative(f))


def suggest(trial: optuna.trial.BaseTrial, seed: int, features: Sequence[str] = NUMERIC_FEATURES) -> GovernorParams:
    """One candidate of the selection study: its family first, then (for a tree grown here) the features it may split on
    and its hyper-parameters."""
    family = trial.suggest_categorical("family", list(FAMILIES))
    if family == "fixed":
        return FixedParams(seed=seed)
    if family == "published":
        return PublishedParams(published_features(), seed)
    use = [f for f in features if trial.suggest_categorical(f"use_{f}", [True, False])]
    if not use:
        use = ["num_layers"]
    mf = trial.suggest_categorical("max_features", ["all", "sqrt", "0.5", "0.75"])
    max_features = None if mf == "all" else ("sqrt" if mf == "sqrt" else float(mf))
    if family == "curve":
        grow_on = trial.suggest_categorical("grow_on", list(GROW_ON))
        return CurveParams(max_depth=trial.suggest_int("curve_max_depth", 0, 5), min_samples_leaf=trial.suggest_int("min_samples_leaf", 1, 5),
                           min_samples_split=trial.suggest_int("min_samples_split", 2, 10),
                           ccp_alpha=trial.suggest_float("curve_ccp_alpha", 0.0, 0.002),
                           time_weight=trial.suggest_categorical("time_weight", [0.0, 0.1, 0.3]) if grow_on == "curve" else 0.0,
                           max_features=max_features, features=tuple(use), seed=seed, grow_on=grow_on)  # type: ignore[arg-type]
    cw = trial.suggest_categorical("class_weight", ["none", "balanced"])
    return TreeParams(
        criterion=trial.suggest_categorical("criterion", ["gini", "entropy", "log_loss"]),
        max_depth=trial.suggest_int("max_depth", 1, 6),
        min_samples_split=trial.suggest_int("min_samples_split", 2, 10),
        min_samples_leaf=trial.suggest_int("min_samples_leaf", 1, 5),
        max_features=max_features,  # type: ignore[arg-type]
        ccp_alpha=trial.suggest_float("ccp_alpha", 0.0, 0.05),
        class_weight=None if cw == "none" else cw,
        features=tuple(use),
        seed=seed,
    )


def _params_from_trial(trial: optuna.trial.BaseTrial, seed: int, features: Sequence[str] = NUMERIC_FEATURES) -> GovernorParams:
    return suggest(trial, seed, features)


def study_params(study: optuna.Study, curves: Sequence[WorkloadCurve], seed: int = 0) -> GovernorParams:
    """The configuration a selection study chose (`select`'s family rule, its trial kept in the study's user attribute
    `selected_trial`; a study no `select` finished: its best trial), on the curves it selected on (they decide which
    features were offered: `search_features`)."""
    import optuna

    number = study.user_attrs.get("selected_trial")
    trial = study.best_trial if number is None else study.trials[int(number)]
    return _params_from_trial(optuna.trial.FixedTrial(trial.params), seed, search_features(curves))


def warm_starts(features: Sequence[str] = NUMERIC_FEATURES) -> list[dict[str, Any]]:
    """The first trials of a new study, in this order: the fixed clock, two curve trees (depth 3 grown on the best
    clock, depth 2 on the whole curve) and a depth-3 classifier, all on every feature, and the published tree. The
    study's best is its first trial of the least regret, so a tie goes to the simpler candidate: one clock before a
    tree, a tree learnt on this board before the published one."""
    every = {f"use_{f}": True for f in features}
    return [
        {"family": "fixed"},
        {"family": "curve", "grow_on": "best-clock", "curve_max_depth": 3, "min_samples_leaf": 2, "min_samples_split": 2,
         "curve_ccp_alpha": 0.0, "max_features": "all", **every},
        {"family": "curve", "grow_on": "curve", "curve_max_depth": 2, "min_samples_leaf": 2, "min_samples_split": 2,
         "curve_ccp_alpha": 0.0, "time_weight": 0.0, "max_features": "all", **every},
        {"family": "classifier", "criterion": "gini", "max_depth": 3, "min_samples_split": 2, "min_samples_leaf": 1, "max_features": "all",
         "ccp_alpha": 0.0, "class_weight": "none", **every},
        {"family": "published"},
    ]


def choose_split(curves: Sequence[WorkloadCurve], wanted: str = "auto") -> str:
    """The selection/reporting split: `wanted`, or (auto) leave one task out when there are 3+ tasks, else one workload."""
    if wanted != "auto":
        if wanted not in SPLITS:
            raise DvfsError(f"unknown CV split {wanted!r}; valid: auto, {', '.join(SPLITS)}")
        return wanted
    return "task" if len({c.task for c in curves}) >= 3 else "workload"


def _inner_split(curves: Sequence[WorkloadCurve], split: str) -> str:
    return split if len({group_of(c, split) for c in curves}) >= 2 else "workload"


def repeated_splits(curves: Sequence[WorkloadCurve], inner: str) -> list[str]:
    """The splits a finalist is re-scored on: the inner split first, then every other split with 2+ groups."""
    return [inner, *(s for s in SPLITS if s != inner and len({group_of(c, s) for c in curves}) >= 2)]


@dataclasses.dataclass(frozen=True)
class FamilyPick:
    """One family's candidate in a selection study: its best trial, or (the winning family) its finalist.

    Attributes:
        family: curve, classifier, fixed or published.
        trial: the study's trial number.
        inner: its score on the selection's inner split (per-workload regrets, for the paired comparison).
        repeated: its mean regret over `repeated_splits` (what ranked the winning family's finalists; NaN where the
            family was not re-scored).
        finalists: how many distinct configurations of the family were re-scored (1: none was).
    """

    family: str
    trial: int
    inner: CVScore
    repeated: float
    finalists: int


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which family a selection study's trials chose, and why (`choose_family`).

    Attributes:
        picks: family -> its finalist.
        incumbent: the family preferred before any comparison (the first of PREFERENCE the study tried).
        winner: the family chosen: the incumbent, or a rival that beat it by more than the inner CV's noise.
    """

    picks: dict[str, FamilyPick]
    incumbent: str
    winner: str

    @property
    def trial(self) -> int:
        return self.picks[self.winner].trial

    def why(self) -> str:
        """One sentence per rival: its inner regret and its paired difference to the incumbent, within the noise or not."""
        inc = self.picks[self.incumbent]
        parts = []
        for family, pick in sorted(self.picks.items(), key=lambda kv: kv[1].inner.regret):
            if family == self.incumbent:
                continue
            mean, lo, hi = pick.inner.minus(inc.inner)
            how = "better beyond the noise" if hi < 0 else "worse beyond the noise" if lo > 0 else "within the noise"
            parts.append(f"{family} {_pct(pick.inner.regret)} ({100 * mean:+.3f} points [{100 * lo:+.3f}, {100 * hi:+.3f}], {how})")
        head = (f"The {self.incumbent} family is preferred ({', '.join(PREFERENCE)}, in order) and a rival replaces it only where it "
                f"wins the inner cross-validation by more than its noise (the paired 95 % interval below 0), or one fixed clock "
                f"does no worse than any; the winner's configuration is the best of its {FINALISTS} best trials by the mean over "
                f"repeated splits. Inner regret: {self.incumbent} {_pct(inc.inner.regret)}")
        tail = f"; {'; '.join(parts)}" if parts else ""
        if self.winner == self.incumbent:
            verdict = f" The {self.winner} family won."
        elif self.picks[self.winner].inner.minus(inc.inner)[2] < 0.0:
            verdict = f" The {self.winner} family won by more than the noise."
        else:
            verdict = f" The {self.winner} family won: one clock for all, no family did better."
        return head + tail + "." + verdict


# The family kept unless a rival wins the inner CV by more than its noise: the curve tree learns from the curve model's
# fits and holds whole curves in its leaves; then one clock (no feature); the classifier (hard labels of one noisy best
# clock, whose best inner score over many trials is the most optimistic: benchmarks/results/governor_selection.md); and
# the published tree, learnt on another board.
PREFERENCE = ("curve", "fixed", "classifier", "published")
SIMPLEST = "fixed"  # reads no feature: it replaces the preferred family wherever no family does better on the inner split
FINALISTS = 5  # the winning family's best trials by inner regret, re-scored over repeated splits


def choose_family(trials: Sequence[Any], curves: Sequence[WorkloadCurve], objective: Objective, clocks: Sequence[float], inner: str,
                  seed: int, features: Sequence[str], known: dict[int, CVScore] | None = None,
                  built: dict[int, GovernorParams] | None = None) -> Selection:
    """The selection rule over a study's finished trials.

    The family: each family is represented by its best trial; the first family of PREFERENCE the study tried is kept
    unless a rival beats it on the inner split by more than the CV's noise (the upper end of the paired 95 % bootstrap
    interval of rival minus incumbent below 0), or the fixed clock (SIMPLEST) does no worse than any family; among such rivals the
    least inner regret wins (a tie: the earlier in PREFERENCE). One split's estimate of the best of many trials is
    optimistic, and the family with the most trials and knobs profits most from that: the margin guards against it.
    The configuration: of the winning family's FINALISTS best trials (distinct configurations), the one with the least
    mean regret over `repeated_splits`.

    Args:
        trials: the study's finished trials (FrozenTrial: params, value, number).
        curves: the workloads the study selected on.
        objective: what a clock is scored by.
        clocks: the sweep's clocks.
        inner: the split of the study's inner CV.
        seed: the trees' seed.
        features: the features the study offered (`search_features`).
        known: trial number -> its inner CVScore, where the study's objective kept it (others are recomputed).
        built: trial number -> the configuration it was built as, where the study's objective kept it (others are
            rebuilt from their params).

    Returns:
        The `Selection`.
    """
    import optuna

    known = dict(known or {})
    built = dict(built or {})
    splits = repeated_splits(curves, inner)

    def params_of(t: Any) -> GovernorParams:
        if t.number not in built:
            built[t.number] = _params_from_trial(optuna.trial.FixedTrial(t.params), seed, features)
        return built[t.number]

    by_family: dict[str, list[Any]] = collections.defaultdict(list)
    for t in sorted(trials, key=lambda t: (t.value, t.number)):
        by_family[t.params["family"]].append(t)

    def inner_score(t: Any, params: GovernorParams) -> CVScore:
        if t.number not in known:
            known[t.number] = cross_validate(curves, objective, policy_fitter(objective, params, clocks), inner, INNER_FOLDS)
        return known[t.number]

    picks: dict[str, FamilyPick] = {}
    for family, ts in by_family.items():
        picks[family] = FamilyPick(family, ts[0].number, inner_score(ts[0], params_of(ts[0])), math.nan, 1)
    incumbent = next(f for f in (*PREFERENCE, *sorted(picks)) if f in picks)
    inc = picks[incumbent].inner
    least = min(p.inner.regret for p in picks.values())
    rivals = [f for f, p in picks.items() if f != incumbent and (p.inner.minus(inc)[2] < 0.0 or (f == SIMPLEST and p.inner.regret <= least + 1e-12))]
    winner = min(rivals, key=lambda f: (picks[f].inner.regret, PREFERENCE.index(f) if f in PREFERENCE else len(PREFERENCE))) if rivals else incumbent
    distinct: dict[GovernorParams, Any] = {}
    for t in by_family[winner]:
        distinct.setdefault(params_of(t), t)
        if len(distinct) == FINALISTS:
            break
    if len(distinct) > 1:  # the winning family's finalists, ranked over repeated splits
        scored = []
        for params, t in distinct.items():
            s = inner_score(t, params)
            rest = [cross_validate(curves, objective, policy_fitter(objective, params, clocks), split, INNER_FOLDS).regret for split in splits[1:]]
            scored.append((float(np.mean([s.regret, *rest])), t.number, s))
        repeated, number, s = min(scored, key=lambda x: (x[0], x[1]))
        picks[winner] = FamilyPick(winner, number, s, repeated, len(distinct))
    return Selection(picks, incumbent, winner)


def select(curves: Sequence[WorkloadCurve], objective: Objective, clocks: Sequence[float], split: str, trials: int, seed: int,
           study: Any = None, callbacks: Sequence[Any] = ()) -> tuple[GovernorParams, Any]:
    """Optuna on inner CV of `curves` only, then `choose_family` over its trials; returns the chosen params and the study
    (its user attributes: `selected_trial`, and `selection`, the family rule's reasons in words)."""
    params, study, _ = select_with_reasons(curves, objective, clocks, split, trials, seed, study, callbacks)
    return params, study


def select_with_reasons(curves: Sequence[WorkloadCurve], objective: Objective, clocks: Sequence[float], split: str, trials: int,
                        seed: int, study: Any = None, callbacks: Sequence[Any] = ()) -> tuple[GovernorParams, Any, Selection]:
    """`select`, with the `Selection` that says which family won and why."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if study is None:
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    inner = _inner_split(curves, split)
    features = search_features(curves)
    known: dict[int, CVScore] = {}
    built: dict[int, GovernorParams] = {}

    def objective_fn(trial: optuna.Trial) -> float:
        params = built[trial.number] = _params_from_trial(trial, seed, features)
        s = cross_validate(curves, objective, policy_fitter(objective, params, clocks), inner, INNER_FOLDS)
        known[trial.number] = s
        trial.set_user_attr("accuracy", s.accuracy)
        trial.set_user_attr("family", family_of(params))
        return s.regret

    if not study.trials:
        for warm in warm_starts(features):
            study.enqueue_trial(warm, skip_if_exists=True)  # two processes joining one new study enqueue them once
    study.optimize(objective_fn, n_trials=trials, callbacks=list(callbacks), gc_after_trial=False)
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    selection = choose_family(done, curves, objective, clocks, inner, seed, features, known, built)
    study.set_user_attr("selected_trial", selection.trial)
    study.set_user_attr("selection", selection.why())
    chosen = built.get(selection.trial) or study_params(study, curves, seed)
    return chosen, study, selection


@dataclasses.dataclass
class NestedScore:
    """Nested held-out scores of one split: each outer group scored by a policy selected without it.

    Attributes:
        split: the groups held out: workload, task or model.
        n_groups: how many outer groups (folds).
        governor: the search's score (a fresh selection study per fold, over every family of candidate).
        ffg: the fixed-frequency governor's (one clock fitted on the other groups).
        paper: the published tree's (no fitting).
        families: the family each fold's selection chose, fold by fold.
    """

    split: str
    n_groups: int
    governor: CVScore
    ffg: CVScore
    paper: CVScore
    families: tuple[str, ...] = ()


def nested_cv(curves: Sequence[WorkloadCurve], objective: Objective, clocks: Sequence[float], split: str, trials: int,
              seed: int) -> NestedScore | None:
    """Held-out score of the whole selection procedure: per outer group, a fresh study on the rest. None: < 2 groups."""
    outer = folds(curves, split)
    if len(outer) < 2:
        return None
    gov: dict[str, float] = {}
    ffg: dict[str, float] = {}
    families = []
    for held in outer:
        hs = set(held)
        train = [c for i, c in enumerate(curves) if i not in hs]
        params, _ = select(train, objective, clocks, split, trials, seed)
        families.append(family_of(params))
        choose = policy_fitter(objective, params, clocks)(train)
        fixed = ffg_fitter(objective, clocks)(train)
        for i in held:
            gov[curves[i].workload] = choose(curves[i])
            ffg[curves[i].workload] = fixed(curves[i])
    return NestedScore(split, len(outer), score(curves, gov, objective), score(curves, ffg, objective),
                       paper_score(curves, objective, clocks), tuple(families))


def _pct(x: float) -> str:
    return f"{100 * x:.3f} %"


@dataclasses.dataclass
class SearchResult:
    """What `run_search` found: the registered configuration, its refit policy and the scores.

    Attributes:
        best_params: the configuration registered: the selection study's choice (`search_params`), or FFG's fixed
            clock where the search's held-out regret was not below FFG's (`floored`).
        tree: the registered configuration on the selection folds (inner: optimistic, for reference only).
        ffg: the fixed-frequency governor on the same folds.
        paper: the published tree's score.
        policy: the registered configuration refit on every training workload (`TreePolicy`).
        classifier: the refit sklearn estimator (a regressor for the curve family; None for a depth-0 curve policy,
            a fixed clock or the published tree).
        study: the Optuna selection study.
        n_workloads: the training workloads searched.
        split: the split of selection and of the score the gates read.
        nested: split -> `NestedScore` (held-out scores).
        features_matter: the search's held-out regret is below FFG's by more than the CV's noise (the upper end of the
            paired 95 % interval of search minus FFG is below 0), on `split`.
        study_name: the selection study's name.
        expected_truth: regrets are against the twin's expected curves (else the mean over repeats).
        search_params: the selection study's choice (`choose_family`; None: the same as `best_params`).
        trials: the selection study's trials.
        fit_check: whether the curve model describes the training curves (`dataset.check_fit`); the trees learnt from
            its fits where it does.
        selection: which family the selection study's trials chose and why (`choose_family`).
        family: (property) curve, classifier, fixed or published.
        floored: (property) FFG's clock replaced the search's choice.
        heldout: (property) the nested score of `split`, None where it has fewer than two groups.
    """

    best_params: GovernorParams
    tree: CVScore  # the registered configuration on the selection folds (inner: optimistic, for reference only)
    ffg: CVScore  # FFG on the same folds
    paper: CVScore
    policy: TreePolicy
    classifier: Any
    study: Any
    n_workloads: int
    split: str = "workload"
    nested: dict[str, NestedScore] = dataclasses.field(default_factory=dict)  # split -> held-out scores
    features_matter: bool = False
    study_name: str = ""
    expected_truth: bool = False  # regrets are against the twin's expected curves (else mean over repeats)
    search_params: GovernorParams | None = None
    trials: int = 0
    fit_check: FitCheck | None = None
    selection: Selection | None = None

    @property
    def family(self) -> str:
        return family_of(self.best_params)

    @property
    def floored(self) -> bool:
        return self.search_params is not None and self.search_params != self.best_params

    @property
    def heldout(self) -> NestedScore | None:
        return self.nested.get(self.split)

    def _version_score(self, ns: NestedScore) -> CVScore:
        """The registered version's held-out score: FFG's where it is FFG's clock (the floor, or the search's own choice),
        else the search's."""
        return ns.ffg if isinstance(self.best_params, FixedParams) else ns.governor

    def metrics(self) -> dict[str, float]:
        """What the governor run logs and the gates read (all fractions).

        `tree_outer_*` are the registered version's held-out figures (FFG's where the floor held), `search_outer_*`
        the search's own, `tree_minus_ffg_outer_regret` (with its paired 95 % interval, `_ci_low`/`_ci_high`) the
        version's held-out regret minus FFG's on the same workloads; `floored` is 1 where FFG's clock replaced the search's choice;
        `curve_model_clock_error`/`neighbour_clock_error` the curve model's check (`dataset.FitCheck`) and
        `fitted_curves` 1 where the trees learnt from the model's fits."""
        m: dict[str, float] = {"n_workloads": float(self.n_workloads), "features_matter": float(self.features_matter),
                               "tree_depth": float(policy_tree.tree_depth(self.policy.policy["tree"])),
                               "n_features_used": float(len(policy_tree.features_used(self.policy.policy["tree"]))),
                               "tree_inner_regret": self.tree.regret, "ffg_inner_regret": self.ffg.regret,
                               "floored": float(self.floored)}
        if self.fit_check is not None and self.fit_check.points:
            m.update({"curve_model_clock_error": self.fit_check.model_error, "neighbour_clock_error": self.fit_check.neighbour_error,
                      "fitted_curves": float(self.fit_check.model_fits)})
        for split, ns in self.nested.items():
            version = self._version_score(ns)
            for name, s in (("tree", version), ("ffg", ns.ffg), ("paper", ns.paper), ("search", ns.governor)):
                m[f"{name}_outer_regret_{split}"] = s.regret
                if split == self.split:
                    m.update(s.as_metrics(f"{name}_outer"))
            if split == self.split:
                m["n_outer_groups"] = float(ns.n_groups)
                mean, lo, hi = version.minus(ns.ffg)
                m.update({"tree_minus_ffg_outer_regret": mean, "tree_minus_ffg_outer_regret_ci_low": lo,
                          "tree_minus_ffg_outer_regret_ci_high": hi})
        return m

    def _learnt_from(self) -> str:
        check = self.fit_check
        if check is None or check.points == 0:
            return "their measured curves"
        figures = (f"a clock left out predicted {_pct(check.model_error)} off by the curve model, {_pct(check.neighbour_error)} by "
                   "the line between its neighbours")
        if check.model_fits and getattr(self.best_params, "fitted", False):
            return f"the curve model's fits of their measurements ({figures})"
        return f"their measured curves (the curve model does not describe them: {figures})"

    def _what(self) -> str:
        tree = self.policy.policy["tree"]
        if isinstance(self.best_params, FixedParams):
            return (f"A fixed clock, {tree['freq_mhz']:g} MHz, for every workload: FFG's clock (the least mean normalised cost "
                    f"over the {self.n_workloads} training workloads).")
        if isinstance(self.best_params, PublishedParams):
            return (f"The published tree ({self.policy.policy.get('baseline', 'paper-mlg')}) as it is, splitting on "
                    f"{', '.join(self.best_params.features)}.")
        used = sorted(policy_tree.features_used(tree))
        if isinstance(self.best_params, CurveParams):
            grown = "its splits on each workload's best clock" if self.best_params.grow_on == "best-clock" else "its splits on the whole curves"
            kind = f"curve tree (leaves hold mean normalised energy/time curves; {grown})"
        else:
            kind = "classifier tree (leaves hold clocks)"
        return (f"A {kind} of depth {policy_tree.tree_depth(tree)}, splitting on {', '.join(used) or 'nothing (one clock for all)'}, "
                f"learnt on {self.n_workloads} training workloads from {self._learnt_from()}.")

    def description(self) -> str:
        """The registered version's description: what it is, which family of candidate won, and why (the held-out figures).

        Plain text, a few short paragraphs; the figures are the nested CV's on the split the gates read."""
        truth = "the twin's expected curves, SIMULATED" if self.expected_truth else "the mean over repeats"
        lines = [self._what()]
        searched = f"{self.trials} Optuna trials over {', '.join(FAMILIES)} candidates, chosen by inner cross-validation"
        if self.selection is not None:
            lines.append(f"Which family: {self.selection.why()}")
        ns = self.heldout
        if ns is None:
            lines.append(f"Chosen among {searched}; too few {self.split} groups for a held-out figure.")
            return "\n\n".join(lines)
        held = f"held out (nested CV, one {self.split} out, {ns.n_groups} folds; regret against {truth})"
        version = self._version_score(ns)
        chose = ", ".join(f"{family} in {n}" for family, n in sorted(collections.Counter(ns.families).items(), key=lambda kv: -kv[1]))
        if self.floored:
            lines.append(f"Why this one: a fixed clock is the floor every candidate is measured against. The search ({searched}) "
                         f"chose a {family_of(self.search_params)} candidate, and the search scored {_pct(ns.governor.regret)} {held}, "  # type: ignore[arg-type]  # set whenever floored
                         f"not below FFG's {_pct(ns.ffg.regret)}: FFG's clock is registered instead.")
        else:
            lines.append(f"Why this one: the search ({searched}) chose it. H{held[1:]}, the search scores "
                         f"{_pct(version.regret)} [{_pct(version.ci[0])}, {_pct(version.ci[1])}], FFG {_pct(ns.ffg.regret)}, the "
                         f"published tree {_pct(ns.paper.regret)}.")
        mean, lo, hi = version.minus(ns.ffg)
        verdict = ("features matter here: the search beats one fixed clock by more than the CV's noise" if self.features_matter
                   else "one fixed clock does as well within the CV's noise")
        lines.append(f"This version minus FFG, paired over the held-out workloads: {100 * mean:+.3f} points [{100 * lo:+.3f}, "
                     f"{100 * hi:+.3f}]; {verdict}. Each fold's own search chose: {chose} of {ns.n_groups}.")
        return "\n\n".join(lines)


def param_importances(study: optuna.Study, seed: int = 0) -> dict[str, float]:
    """Each hyper-parameter's share of the trials' regret variance (fANOVA), largest first; {} when too few trials.

    fANOVA, not Optuna's default PED-ANOVA: it is stable API, seeded, and does not warn on the small studies a
    governor search runs ("target and region quantiles select the same set of trials").
    """
    import optuna

    # the parameters every grown tree has (a fixed clock or the published tree has only `family`): fANOVA reads the
    # trials that carry all of them
    grown = [set(t.params) for t in study.trials if t.value is not None and t.params.get("family") in ("curve", "classifier")]
    params = sorted(set.intersection(*grown)) if grown else None
    try:
        imp = optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed),
                                                      params=params)
    except Exception:  # noqa: BLE001 - too few complete trials, or every parameter constant
        return {}
    return {k: float(v) for k, v in sorted(imp.items(), key=lambda kv: -kv[1])}


def importance_plot(study: optuna.Study, path: Path, seed: int = 0) -> bool:
    """A bar chart of `param_importances` saved to `path`; False when the study can't support one yet.

    Drawn with matplotlib directly: optuna.visualization.matplotlib is experimental and warns on every call.
    """
    imp = param_importances(study, seed)
    if not imp:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    ax.barh(names, [imp[n] for n in names])
    ax.set_xlabel("importance for inner-CV regret (fANOVA)")
    ax.set_title("hyper-parameter importances")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


OPTUNA_SCHEMA = "optuna"  # where a study's tables go in a PostgreSQL database (beside MLflow's, which has its own alembic_version)


def storage_url(storage: str) -> str:
    """An Optuna (SQLAlchemy) URL. A bare `postgresql://` means psycopg2 to SQLAlchemy; MLflow reads it as psycopg 3,
    which the `fleet` extra installs: without psycopg2, the same URL goes to psycopg 3 here too.

    PostgreSQL: the study's tables live in the schema `optuna` of that database (made if missing, and named in the
    connection's search_path), so one database can hold MLflow's tables and Optuna's: both keep an `alembic_version`
    table, and Optuna reading MLflow's fails. A database whose `public` schema holds Optuna's tables already (a
    study database made before) is used as it is, and so is a URL that sets its own `options`.

    Raises:
        DvfsError: a PostgreSQL storage that cannot be reached or written (one line saying which, and what to do).
    """
    import importlib.util

    scheme, sep, rest = storage.partition("://")
    base = scheme.split("+", 1)[0]
    if not sep or base not in ("postgresql", "postgres"):
        return storage
    if scheme in ("postgresql", "postgres") and importlib.util.find_spec("psycopg2") is None \
            and importlib.util.find_spec("psycopg") is not None:
        storage = f"postgresql+psycopg://{rest}"
    if "options=" in rest or importlib.util.find_spec("psycopg") is None:
        return storage  # its own search_path, or no psycopg 3 here to look with (Optuna says what it finds)
    if _study_schema(f"postgresql://{rest}") is None:
        return storage
    return storage + ("&" if "?" in rest else "?") + f"options=-csearch_path%3D{OPTUNA_SCHEMA}"


def _study_schema(dsn: str) -> str | None:
    """The schema a PostgreSQL study goes in: None (`public`) where Optuna's tables are there already, else `optuna`
    (created here, so that Optuna's first connection finds it)."""
    import contextlib
    import urllib.parse

    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regclass('public.studies') IS NOT NULL AND to_regclass('public.alembic_version') IS NOT NULL "
                               "AND to_regclass('public.experiments') IS NULL").fetchone()
            if row and row[0]:
                return None
            with contextlib.suppress(psycopg.errors.UniqueViolation):  # two trainers made it at once: the other's is there
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}")
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        where = urllib.parse.urlsplit(dsn)
        raise DvfsError(f"--storage postgresql://{where.hostname}:{where.port or 5432}{where.path}: the Optuna study's PostgreSQL database is unreachable or refused "
                        f"the schema {OPTUNA_SCHEMA!r} ({first}); check the URL, or grant CREATE on the database "
                        f"(or make the schema: CREATE SCHEMA {OPTUNA_SCHEMA})") from None
    return OPTUNA_SCHEMA


def joined_sampler(seed: int, worker: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of a study several processes may share (Optuna's distributed mode): each process samples with its
    own seed (`worker`, else a random one: the same seed everywhere would propose the same trials) and TPE's constant
    liar keeps it off the trials other processes are running."""
    import optuna

    salt = uuid.uuid4().int if worker is None else worker + 1
    return optuna.samplers.TPESampler(seed=(seed * 1_000_003 + salt) % 2**31, constant_liar=True)


def _create_study(storage: str, name: str, join: bool, sampler: optuna.samplers.BaseSampler, attempts: int = 5) -> optuna.Study:
    """optuna.create_study; on a fresh RDB, processes that start together race to create Optuna's tables (one wins,
    the others fail on a duplicate): they retry, and then find the tables made."""
    import time

    import optuna

    for attempt in range(attempts):
        try:
            return optuna.create_study(direction="minimize", storage=storage, study_name=name, load_if_exists=join, sampler=sampler)
        except Exception as e:
            if attempt == attempts - 1 or type(e).__module__.split(".")[0] != "sqlalchemy":
                raise
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One finished trial of the selection study, as `run_search` reports it to `on_trial`."""

    study_name: str
    number: int
    params: dict[str, Any]
    inner_regret: float
    inner_accuracy: float


def run_search(dataset: GovernorDataset, objective: Objective, trials: int = 60, seed: int = 0, storage: str | None = None,
               study_name: str | None = None, on_trial: Callable[[TrialRecord], None] | None = None, cv_split: str = "auto",
               outer_trials: int | None = None, outer_splits: Sequence[str] = SPLITS) -> SearchResult:
    """Select a governor on the dataset's training workloads, report nested held-out scores, refit the best.

    Args:
        dataset: the sweep's workloads (`GovernorDataset`); only its `train` split is searched.
        objective: what a clock is scored by (`objectives.parse_objective`).
        trials: Optuna TPE trials of the selection study.
        seed: the seed of the sampler, the trees and the nested studies.
        storage: the selection study's Optuna storage URL (None: in memory).
        study_name: join this study (several processes may); None makes a fresh one.
        on_trial: called with each finished trial (`TrialRecord`), e.g. to log it as a run.
        cv_split: groups held out for selection and the gated score: auto, workload, task or model.
        outer_trials: trials of each outer fold's own in-memory study (default `trials`).
        outer_splits: the splits that also get a nested held-out score.

    Returns:
        A `SearchResult`: the registered parameters (the search's, or FFG's clock where the floor held), the refit
        policy, the nested scores.

    Raises:
        DvfsError: fewer training workloads than cross-validation needs.
    """
    import optuna

    train = dataset.split("train")
    if len(train) < MIN_WORKLOADS:
        raise DvfsError(f"sweep {dataset.sweep_id} has {len(train)} training workload(s); cross-validation needs at least "
                        f"{MIN_WORKLOADS} (sweep more models/tasks, e.g. --preset quick)")
    fitted = with_fitted_curves(train)
    curves = fitted.curves
    freqs = dataset.frequencies
    split = choose_split(curves, cv_split)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # a fresh study per request: an older study's trials never steer this selection unless joined by name on purpose
    label = dataset.sweep_id if "," not in dataset.sweep_id else f"{len(dataset.sweep_id.split(','))}sweeps"
    name = study_name or f"governor-{label}-{objective.name}-{uuid.uuid4().hex[:8]}"
    sampler = joined_sampler(seed) if study_name else optuna.samplers.TPESampler(seed=seed)
    study = _create_study(storage_url(storage or "sqlite:///:memory:"), name, study_name is not None, sampler)

    def log_trial(study_: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if on_trial is not None and trial.value is not None:
            on_trial(TrialRecord(name, trial.number, dict(trial.params), float(trial.value),
                                 float(trial.user_attrs.get("accuracy", math.nan))))

    searched, study, selection = select_with_reasons(curves, objective, freqs, split, trials, seed, study=study, callbacks=[log_trial])
    inner = _inner_split(curves, split)
    n_outer = trials if outer_trials is None else outer_trials
    nested = {}
    for s in dict.fromkeys([split, *outer_splits]):
        ns = nested_cv(curves, objective, freqs, s, n_outer, seed)
        if ns is not None:
            nested[s] = ns
    held = nested.get(split)
    # the floor: a fixed clock is a governor too, and the search's choice must beat it held out (a tie goes to the clock)
    floored = held is not None and held.governor.regret >= held.ffg.regret - 1e-12
    best: GovernorParams = FixedParams(seed=seed) if floored else searched
    tree_score = cross_validate(curves, objective, policy_fitter(objective, best, freqs), inner, INNER_FOLDS)
    ffg = cross_validate(curves, objective, ffg_fitter(objective, freqs), inner, INNER_FOLDS)
    paper = paper_score(curves, objective, freqs)
    features_matter = held is not None and held.governor.minus(held.ffg)[2] < 0.0
    metadata = {
        "name": "dvfs-governor", "device_profile": dataset.device_profile, "sweep_id": dataset.sweep_id, "simulated": dataset.simulated,
        "n_workloads": len(curves), "frequencies_mhz": freqs, "features": list(best.features), "cv_split": split,
        "hyperparameters": {k: v for k, v in dataclasses.asdict(best).items() if k not in ("features",)},
        "inner_cv": {"regret": tree_score.regret, "accuracy": tree_score.accuracy},
    }
    if held is not None:
        version = held.ffg if isinstance(best, FixedParams) else held.governor
        metadata["outer_cv"] = {"split": split, "regret": version.regret, "regret_ci": list(version.ci)}
    policy, est = fit_policy(curves, objective, best, freqs, metadata)
    result = SearchResult(best, tree_score, ffg, paper, TreePolicy(policy), est, study, len(curves), split, nested,
                          features_matter, name, all(c.has_expected for c in curves), searched,
                          len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))), fitted.fit_check,
                          selection)
    result.policy.policy["description"] = result.description()
    return result
