"""Optuna search over decision-tree hyper-parameters, scored by leave-one-workload-out CV.

Each trial: a DecisionTreeClassifier (criterion, depth, split/leaf sizes, max_features,
ccp_alpha, class weights, and which features it may use) is fit on all training workloads but
one and asked for the held-out one's clock, for every workload. The score is the mean energy
regret E(chosen)/E(oracle) - 1 (what a user pays), LOOCV accuracy is reported beside it (the
study's 0.62). FFG and the published tree are scored on the same folds. Each trial is a nested
MLflow run under one `dvfs-governor` run; the study lives in SQLite next to the tracking DB and
resumes by name.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.governor.dataset import (
    NUMERIC_FEATURES,
    GovernorDataset,
    WorkloadCurve,
    feature_matrix,
)
from dvfs_mlops.governor.objectives import Objective
from dvfs_mlops.governor.policies import FixedPolicy, TreePolicy, paper_tree

MIN_WORKLOADS = 4


@dataclasses.dataclass(frozen=True)
class CVScore:
    regret: float  # mean over held-out workloads
    accuracy: float  # share of held-out workloads whose label was hit
    choices: dict[str, float]  # workload -> chosen clock

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_loocv_regret": self.regret, f"{prefix}_loocv_accuracy": self.accuracy}


def score(curves: Sequence[WorkloadCurve], choices: dict[str, float], objective: Objective) -> CVScore:
    regrets = [c.regret(choices[c.workload], objective) for c in curves]
    hits = [choices[c.workload] == c.label(objective) for c in curves]
    return CVScore(float(np.mean(regrets)), float(np.mean(hits)), choices)


def loocv(curves: Sequence[WorkloadCurve], objective: Objective,
          fit: Callable[[Sequence[WorkloadCurve]], Callable[[WorkloadCurve], float]]) -> CVScore:
    """Leave-one-workload-out: fit on the others, choose for the held-out one."""
    choices = {}
    for i, held in enumerate(curves):
        rest = [c for j, c in enumerate(curves) if j != i]
        choices[held.workload] = fit(rest)(held)
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

    def classifier(self) -> Any:
        from sklearn.tree import DecisionTreeClassifier

        return DecisionTreeClassifier(criterion=self.criterion, max_depth=self.max_depth, min_samples_split=self.min_samples_split,
                                      min_samples_leaf=self.min_samples_leaf, max_features=self.max_features,
                                      ccp_alpha=self.ccp_alpha, class_weight=self.class_weight, random_state=self.seed)


def fit_tree(curves: Sequence[WorkloadCurve], objective: Objective, params: TreeParams) -> Any:
    clf = params.classifier()
    labels = [c.label(objective) for c in curves]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(np.asarray(feature_matrix(curves, params.features)), np.asarray(labels))
    return clf


def tree_fitter(objective: Objective, params: TreeParams) -> Callable[[Sequence[WorkloadCurve]], Callable[[WorkloadCurve], float]]:
    def fit(train: Sequence[WorkloadCurve]) -> Callable[[WorkloadCurve], float]:
        clf = fit_tree(train, objective, params)
        return lambda c: float(clf.predict(np.asarray(feature_matrix([c], params.features)))[0])

    return fit


def ffg_fitter(objective: Objective, frequencies: Sequence[float]) -> Callable[[Sequence[WorkloadCurve]], Callable[[WorkloadCurve], float]]:
    def fit(train: Sequence[WorkloadCurve]) -> Callable[[WorkloadCurve], float]:
        f = FixedPolicy.fit(train, objective).choose(None, frequencies)
        return lambda c: float(f)

    return fit


def paper_score(curves: Sequence[WorkloadCurve], objective: Objective, frequencies: Sequence[float]) -> CVScore:
    """The published tree needs no fitting: every workload is already 'held out'."""
    tree = paper_tree()
    return score(curves, {c.workload: float(tree.choose(c.features, frequencies)) for c in curves}, objective)


def suggest(trial: Any, seed: int) -> TreeParams:
    use = [f for f in NUMERIC_FEATURES if trial.suggest_categorical(f"use_{f}", [True, False])]
    if not use:
        use = ["num_layers"]
    mf = trial.suggest_categorical("max_features", ["all", "sqrt", "0.5", "0.75"])
    return TreeParams(
        criterion=trial.suggest_categorical("criterion", ["gini", "entropy", "log_loss"]),
        max_depth=trial.suggest_int("max_depth", 1, 6),
        min_samples_split=trial.suggest_int("min_samples_split", 2, 10),
        min_samples_leaf=trial.suggest_int("min_samples_leaf", 1, 5),
        max_features=None if mf == "all" else ("sqrt" if mf == "sqrt" else float(mf)),  # type: ignore[arg-type]
        ccp_alpha=trial.suggest_float("ccp_alpha", 0.0, 0.05),
        class_weight=trial.suggest_categorical("class_weight", ["none", "balanced"]),
        features=tuple(use),
        seed=seed,
    )


def _params_from_trial(trial: Any, seed: int) -> TreeParams:
    p = suggest(trial, seed)
    return dataclasses.replace(p, class_weight=None if p.class_weight == "none" else p.class_weight)


@dataclasses.dataclass
class SearchResult:
    best_params: TreeParams
    tree: CVScore
    ffg: CVScore
    paper: CVScore
    policy: TreePolicy
    classifier: Any
    study: Any
    n_workloads: int
    governor_run_id: str | None


def param_importances(study: Any, seed: int = 0) -> dict[str, float]:
    """Each hyper-parameter's share of the trials' regret variance (fANOVA), largest first; {} when too few trials.

    fANOVA, not Optuna's default PED-ANOVA: it is stable API, seeded, and does not warn on the small studies a
    governor search runs ("target and region quantiles select the same set of trials").
    """
    import optuna

    try:
        imp = optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed))
    except Exception:  # noqa: BLE001 - too few complete trials, or every parameter constant
        return {}
    return {k: float(v) for k, v in sorted(imp.items(), key=lambda kv: -kv[1])}


def importance_plot(study: Any, path: Path, seed: int = 0) -> bool:
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
    ax.set_xlabel("importance for LOOCV regret (fANOVA)")
    ax.set_title("hyper-parameter importances")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def optuna_storage() -> str:
    """SQLite next to the tracking DB when that is SQLite, else ./optuna.db."""
    from dvfs_mlops import tracking

    uri = tracking.tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return f"sqlite:///{db.parent / 'optuna.db'}"
    return "sqlite:///optuna.db"


def run_search(dataset: GovernorDataset, objective: Objective, trials: int = 60, seed: int = 0, storage: str | None = None,
               study_name: str | None = None, mlflow_client: Any = None, parent_run_id: str | None = None,
               experiment_id: str | None = None) -> SearchResult:
    """Search, score the baselines on the same folds, refit the best tree on every training workload."""
    import optuna

    curves = dataset.split("train").curves
    if len(curves) < MIN_WORKLOADS:
        raise DvfsError(f"sweep {dataset.sweep_id} has {len(curves)} training workload(s); LOOCV needs at least {MIN_WORKLOADS} "
                        "(sweep more models/tasks, e.g. --preset quick)")
    freqs = dataset.frequencies
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name or f"governor-{dataset.sweep_id}-{objective.name}"
    study = optuna.create_study(direction="minimize", storage=storage or optuna_storage(), study_name=name, load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed))

    def objective_fn(trial: Any) -> float:
        params = _params_from_trial(trial, seed)
        s = loocv(curves, objective, tree_fitter(objective, params))
        trial.set_user_attr("accuracy", s.accuracy)
        return s.regret

    def log_trial(study_: Any, trial: Any) -> None:
        if mlflow_client is None or trial.value is None:
            return
        from dvfs_mlops import tracking

        run = mlflow_client.create_run(experiment_id, run_name=f"trial {trial.number}",
                                       tags={tracking.TAG_PARENT: parent_run_id, "optuna.study": name, "optuna.trial": str(trial.number)})
        tracking.log_run_batch(mlflow_client, run.info.run_id, params=trial.params,
                               metrics={"loocv_regret": trial.value, "loocv_accuracy": trial.user_attrs.get("accuracy", math.nan)})
        mlflow_client.set_terminated(run.info.run_id, "FINISHED")

    if not study.trials:  # warm start: sklearn's defaults at depth 3, and the study's feature set
        base = {"criterion": "gini", "max_depth": 3, "min_samples_split": 2, "min_samples_leaf": 1, "max_features": "all",
                "ccp_alpha": 0.0, "class_weight": "none"}
        study.enqueue_trial({**base, **{f"use_{f}": True for f in NUMERIC_FEATURES}})
        paper_features = {"is_decoder", "num_layers", "hidden_size", "avg_seq_len", "gpu_util_pct"}
        study.enqueue_trial({**base, **{f"use_{f}": f in paper_features for f in NUMERIC_FEATURES}})
    study.optimize(objective_fn, n_trials=trials, callbacks=[log_trial], gc_after_trial=False)
    best = _params_from_trial(optuna.trial.FixedTrial(study.best_trial.params), seed)
    tree_score = loocv(curves, objective, tree_fitter(objective, best))
    ffg = loocv(curves, objective, ffg_fitter(objective, freqs))
    paper = paper_score(curves, objective, freqs)
    clf = fit_tree(curves, objective, best)
    metadata = {
        "name": "dvfs-governor", "objective": objective.name, "device_profile": dataset.device_profile, "sweep_id": dataset.sweep_id,
        "n_workloads": len(curves), "frequencies_mhz": freqs, "features": list(best.features),
        "hyperparameters": {k: v for k, v in dataclasses.asdict(best).items() if k not in ("features",)},
        "loocv": {"regret": tree_score.regret, "accuracy": tree_score.accuracy},
    }
    policy = TreePolicy.from_sklearn(clf, list(best.features), metadata)
    return SearchResult(best, tree_score, ffg, paper, policy, clf, study, len(curves), parent_run_id)
