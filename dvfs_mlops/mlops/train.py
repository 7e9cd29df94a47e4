"""`dvfs-mlops train`: sweep -> dataset -> Optuna (family + hyper-parameters) with nested CV -> logged (and registered) governor."""
from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.mlops import tracking
from dvfs_mlops.mlops.dataset import load_sweep_dataset
from dvfs_mlops.model.governor.dataset import board_power_prior
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.search import SearchResult, TrialRecord, importance_plot, run_search

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainOutcome:
    result: SearchResult
    run_id: str
    version: int | None
    model_uri: str


def train_governor(sweep_id: str | None = None, experiment: str = "dvfs-sweep", objective: str = "energy", trials: int = 60,
                   seed: int = 0, register: bool = True, say: Callable[[str], None] = log.info, storage: str | None = None,
                   study_name: str | None = None, cv_split: str = "auto", outer_trials: int | None = None, sweeps_filter: str = "",
                   mix_profiles: bool = False) -> TrainOutcome:
    """`sweep_id`: one id or "a,b,..." (a fleet's sweeps, one dataset); `sweeps_filter`: every sweep whose points match."""
    import mlflow

    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.mlops.registry import GOVERNOR_EXPERIMENT, load_config

    obj = parse_objective(objective)
    dataset = load_sweep_dataset(sweep_id, experiment, sweeps_filter=sweeps_filter, mix_profiles=mix_profiles)
    c = tracking.client()
    cfg = load_config()
    env_run = settings.mlflow_run_id()
    exp_id = c.get_run(env_run).info.experiment_id if env_run else tracking.experiment_id(c, GOVERNOR_EXPERIMENT)
    label = " (SIMULATED sweep)" if dataset.simulated else ""
    n_sweeps = len(dataset.sweep_id.split(","))
    say(f"training on {'sweep' if n_sweeps == 1 else f'{n_sweeps} sweeps'} {dataset.sweep_id}{label}: {len(dataset.split('train'))} training workloads, "
        f"{len(dataset.frequencies)} clocks, objective {obj.name}, {trials} trials")
    with mlflow.start_run(run_id=env_run, experiment_id=None if env_run else exp_id,
                          run_name=None if env_run else f"governor {_short(dataset.sweep_id)} {obj.name}") as run:
        tags = {"objective": obj.name, "device_profile": dataset.device_profile, "sweep_id": dataset.sweep_id[:4900],
                "n_workloads": str(len(dataset.split("train"))), tracking.TAG_SIMULATED: str(dataset.simulated).lower()}
        prior = board_power_prior(dataset)
        if prior is not None:  # for refine at launch (refine.prior_from_governor)
            from dvfs_mlops.job.refine import PRIOR_TAG

            tags[PRIOR_TAG] = prior.to_json()
            say(f"power prior for refine: {prior.workloads} workloads, idle share {prior.idle_share:g}, "
                f"log dynamic/static ratio {prior.log_ratio_mean:.3f} +- {prior.log_ratio_sd:.3f}")
        else:
            from dvfs_mlops.model.power_prior import MIN_CLOCKS, MIN_WORKLOADS

            say(f"no power prior for refine: it needs at least {MIN_WORKLOADS} workloads with {MIN_CLOCKS} or more clocks "
                "and their GPU utilisation")
        mlflow.set_tags(tags)
        result = run_search(dataset, obj, trials=trials, seed=seed, storage=storage or optuna_storage(), study_name=study_name,
                            on_trial=_trial_logger(c, run.info.run_id, run.info.experiment_id), cv_split=cv_split,
                            outer_trials=outer_trials)
        metrics = result.metrics()
        tags["family"] = result.family
        tags["cv_split"] = result.split
        mlflow.set_tags({"family": result.family, "cv_split": result.split, "optuna.study": result.study_name})
        mlflow.log_params({f"best_{k}": v for k, v in {"family": result.family, **dataclasses.asdict(result.best_params)}.items()})
        with tempfile.TemporaryDirectory() as tmp:
            extra = {}
            if importance_plot(result.study, Path(tmp) / "importance.png"):
                extra["importance"] = str(Path(tmp) / "importance.png")
            info = log_governor(result.policy.policy, registered_name=cfg.name if register else None, classifier=result.classifier,
                                feature_names=list(result.best_params.features), extra_artifacts=extra, metrics=metrics, tags=tags)
    version = int(info.registered_model_version) if register and info.registered_model_version else None
    if version is not None:
        for k, v in tags.items():
            c.set_model_version_tag(cfg.name, str(version), k, v)
    return TrainOutcome(result, run.info.run_id, version, info.model_uri)


def _short(sweep_ids: str) -> str:
    """A run name for one sweep or many (the full list is the `sweep_id` tag)."""
    ids = sweep_ids.split(",")
    return ids[0] if len(ids) == 1 else f"{ids[0]}+{len(ids) - 1} more"


def optuna_storage() -> str:
    """SQLite next to the tracking DB when that is SQLite, else ./optuna.db. Never MLflow's own database: both keep
    their schema version in an `alembic_version` table (a fleet gives Optuna a database of its own, `--storage`)."""
    uri = tracking.tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return f"sqlite:///{db.parent / 'optuna.db'}"
    return "sqlite:///optuna.db"


def _trial_logger(c: Any, parent_run_id: str, experiment_id: str) -> Callable[[TrialRecord], None]:
    """Each finished trial of the selection study as a run nested under the governor's training run."""

    def log_trial(trial: TrialRecord) -> None:
        run = c.create_run(experiment_id, run_name=f"trial {trial.number}",
                           tags={tracking.TAG_PARENT: parent_run_id, "optuna.study": trial.study_name, "optuna.trial": str(trial.number)})
        tracking.log_run_batch(c, run.info.run_id, params=trial.params,
                               metrics={"inner_regret": trial.inner_regret, "inner_accuracy": trial.inner_accuracy})
        c.set_terminated(run.info.run_id, "FINISHED")

    return log_trial
