"""`dvfs-mlops train`: sweep -> dataset -> Optuna (family + hyper-parameters) with nested CV -> logged (and registered) governor."""
from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dvfs_mlops.mlops import lifecycle, schema, tracking
from dvfs_mlops.mlops.dataset import dataset_from_frame, is_replayed, read_sweep_points
from dvfs_mlops.model.governor.dataset import board_power_prior
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.search import SearchResult, TrialRecord, importance_plot, run_search

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.mlops.dataset import SweepPoints
    from dvfs_mlops.mlops.joint_dataset import JointDataset
    from dvfs_mlops.mlops.lifecycle import OwnedRun
    from dvfs_mlops.mlops.registry import RegistryConfig
    from dvfs_mlops.model.governor.configurations import ConfigurationResult
    from dvfs_mlops.model.governor.dataset import GovernorDataset

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainOutcome:
    """What `train_governor` made: the search's result (a `ConfigurationResult` for a joint sweep's governor of
    configurations), its run (and the run's experiment), the version, the model."""

    result: SearchResult | ConfigurationResult
    run_id: str
    version: int | None
    model_uri: str
    experiment: str = schema.GOVERNOR_EXPERIMENT
    truth: str = ""  # a governor of configurations': what its regret is against ("energy_joint_expected_j, ... SIMULATED")


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """What `dvfs-mlops train` is asked.

    Attributes:
        sweep_id: one sweep id or "a,b,..." (a fleet's sweeps, one dataset); '' the experiment's latest.
        sweeps_filter: instead, every sweep with FINISHED points matching this MLflow filter.
        mix_profiles: allow sweeps of different device profiles in one dataset.
        experiment: where the sweeps' runs are.
        objective: energy, edp or max-slowdown:X.
        trials: Optuna trials of the selection study; `outer_trials` those of each nested fold (default `trials`).
        seed: the search's seed.
        register: register the model as a new version of the registry's model.
        storage: the Optuna storage URL ('' SQLite beside a SQLite tracking store, else ./optuna.db).
        study_name: join this study ('' a fresh one).
        cv_split: auto, workload, task or model.
    """

    sweep_id: str = ""
    sweeps_filter: str = ""
    mix_profiles: bool = False
    experiment: str = schema.SWEEP_EXPERIMENT
    objective: str = "energy"
    trials: int = 60
    outer_trials: int | None = None
    seed: int = 0
    register: bool = True
    storage: str = ""
    study_name: str = ""
    cv_split: str = "auto"


def train_governor(request: TrainRequest, say: Callable[[str], None] = log.info) -> TrainOutcome:
    """Train a governor on a sweep (or a fleet's sweeps), log it as a pyfunc and register it as a new version.

    A sweep of the GPU clock trains a governor of GPU clocks (Optuna's search over curve and classifier trees); a joint
    sweep (`--knobs gpu,cpu[,emc] --strategy grid`) a governor of configurations (`train_configuration_governor`).

    Args:
        request: what to train on and how (`TrainRequest`).
        say: where progress lines go.

    Returns:
        The `TrainOutcome`: the search's result, the run, the new version (None with `register=False`), the model URI.

    Raises:
        DvfsError: no such sweep or experiment, unusable workloads, too few training workloads, an unknown objective.
    """
    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.mlops.registry import load_config

    r = request
    obj = parse_objective(r.objective)
    cfg = load_config()
    c = tracking.check_reachable()
    with lifecycle.owned_run(schema.GOVERNOR_EXPERIMENT, name=f"governor {obj.name}", client=c, fluent=True) as run:
        points = read_sweep_points(r.sweep_id or None, r.experiment, sweeps_filter=r.sweeps_filter, mix_profiles=r.mix_profiles,
                                   say=say)
        if points.joint:
            return train_configuration_governor(points, r, run, cfg, say)
        dataset = dataset_from_frame(points.frame, points.label, points.device_profile, points.simulated, points.board)
        label = " (SIMULATED sweep)" if dataset.simulated else " (REPLAYED sweep)" if is_replayed(dataset) else ""
        n_sweeps = len(dataset.sweep_id.split(","))
        say(f"training on {'sweep' if n_sweeps == 1 else f'{n_sweeps} sweeps'} {dataset.sweep_id}{label}: {len(dataset.split('train'))} training workloads, "
            f"{len(dataset.frequencies)} clocks, objective {obj.name}, {r.trials} trials")
        tags = {schema.TAG_OBJECTIVE: obj.name, schema.TAG_VERSION_PROFILE: dataset.device_profile,
                schema.TAG_VERSION_SWEEP: dataset.sweep_id[:4900], schema.TAG_N_WORKLOADS: str(len(dataset.split("train"))),
                schema.TAG_SIMULATED: str(dataset.simulated).lower(), schema.TAG_BOARD_FAMILY: dataset_family(dataset),
                **_prior_tag(dataset, say)}
        run.log_batch(tags={**tags, schema.TAG_RUN_NAME: f"governor {_short(dataset.sweep_id)} {obj.name}"})
        result = run_search(dataset, obj, trials=r.trials, seed=r.seed, storage=r.storage or optuna_storage(), study_name=r.study_name or None,
                            on_trial=_trial_logger(c, run.run_id, run.experiment_id), cv_split=r.cv_split,
                            outer_trials=r.outer_trials)
        tags.update({schema.TAG_FAMILY: result.family, schema.TAG_CV_SPLIT: result.split})
        run.log_batch(tags={schema.TAG_FAMILY: result.family, schema.TAG_CV_SPLIT: result.split, schema.TAG_OPTUNA_STUDY: result.study_name},
                      params={f"best_{k}": v for k, v in {"family": result.family, **dataclasses.asdict(result.best_params)}.items()})
        with tempfile.TemporaryDirectory() as tmp:
            extra = {}
            if importance_plot(result.study, Path(tmp) / "importance.png"):
                extra["importance"] = str(Path(tmp) / "importance.png")
            info = log_governor(result.policy.policy, registered_name=cfg.name if r.register else None, classifier=result.classifier,
                                feature_names=list(result.best_params.features), extra_artifacts=extra, metrics=result.metrics(),
                                tags=tags, version_tags=tags)
        version = int(info.registered_model_version) if r.register and info.registered_model_version else None
        describe(c, run.run_id, result.description(), cfg.name, version)
    return TrainOutcome(result, run.run_id, version, info.model_uri, run.experiment_name)


# The run's description in MLflow's UI (its "Description" box) is this tag; a registered version has its own field.
RUN_DESCRIPTION_TAG = "mlflow.note.content"
DESCRIPTION_ARTIFACT = "description.md"


def describe(c: MlflowClient, run_id: str, description: str, registered_name: str, version: int | None) -> None:
    """Say which family of candidate won and why (`SearchResult.description()`): the training run's description and
    its `description.md` artifact, and the registered version's description where one was registered."""
    tracking.log_run_batch(c, run_id, tags={RUN_DESCRIPTION_TAG: description[:5000]})
    tracking.log_text_artifact(c, run_id, DESCRIPTION_ARTIFACT, description)
    if version is not None:
        c.update_model_version(registered_name, str(version), description=description)


def train_configuration_governor(points: SweepPoints, request: TrainRequest, run: OwnedRun, cfg: RegistryConfig,
                                 say: Callable[[str], None] = log.info) -> TrainOutcome:
    """A governor of configurations from a joint grid sweep, in the training run `run`: its configuration table
    (`joint_dataset`), nested CV with the fixed configuration as the floor (`configurations.train_configurations`),
    logged as the same pyfunc as a GPU-only governor (its policy.json of configurations) and registered with its tags
    (knobs, the energy metric and its rails, SIMULATED where the twin measured) and description.

    Raises:
        DvfsError: an objective other than energy (the tree learns energy; edp and max-slowdown:X are applied by its
            leaves at decision time), an option of the GPU-only search (`_refuse_search_options`), a workload without
            every configuration, fewer than two training tasks.
    """
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.mlops.joint_dataset import joint_dataset_from_points
    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.model.governor.configurations import FAMILY, to_policy, train_configurations

    r = request
    _refuse_search_options(r)
    if parse_objective(r.objective).name != "energy":
        raise DvfsError(f"a governor of configurations learns energy (objective {r.objective!r} asked); its leaves apply edp and "
                        "max-slowdown:X at decision time (the pyfunc's objective param, evaluate --objective): train with --objective energy")
    joint = joint_dataset_from_points(points)
    train = joint.split("train")
    label = " (SIMULATED sweep)" if joint.simulated else " (REPLAYED sweep)" if points.replayed else ""
    knobs = ",".join(joint.tuned)
    say(f"training a governor of configurations on sweep {joint.sweep_id}{label}: {len(train.table.workloads)} training workloads, "
        f"{len(joint.table.settings)} configurations ({knobs}), energy {joint.metric} on {joint.rails or 'its rails'}")
    result = train_configurations(train.table)
    truth = ("the twin's expected values, SIMULATED" if joint.metric.endswith("_expected_j") else
             "the mean over repeats, SIMULATED" if joint.simulated else "the mean over repeats")
    policy = to_policy(result.governor, train.table, train.slowdown, name=cfg.name, knobs=knobs, energy_metric=joint.metric,
                       energy_rails=joint.rails, sweep_id=joint.sweep_id, device_profile=joint.device_profile,
                       simulated=joint.simulated, n_workloads=len(train.table.workloads))
    family = dataset_family(joint)
    tags = {schema.TAG_OBJECTIVE: "energy", schema.TAG_VERSION_PROFILE: joint.device_profile, schema.TAG_VERSION_SWEEP: joint.sweep_id[:4900],
            schema.TAG_N_WORKLOADS: str(len(train.table.workloads)), schema.TAG_SIMULATED: str(joint.simulated).lower(),
            schema.TAG_BOARD_FAMILY: family, schema.TAG_FAMILY: FAMILY, schema.TAG_CV_SPLIT: "task",
            schema.TAG_VERSION_KNOBS: knobs, schema.TAG_VERSION_ENERGY_METRIC: joint.metric, schema.TAG_VERSION_ENERGY_RAILS: joint.rails}
    g = result.governor
    run.log_batch(tags={**tags, schema.TAG_RUN_NAME: f"governor {_short(joint.sweep_id)} configurations"},
                  params={"best_family": FAMILY, "best_kind": g.kind, "best_depth": g.depth, "best_min_leaf": g.min_leaf,
                          "n_configurations": len(g.settings)})
    info = log_governor(policy, registered_name=cfg.name if r.register else None, metrics=result.metrics(policy), tags=tags,
                        version_tags=tags)
    version = int(info.registered_model_version) if r.register and info.registered_model_version else None
    description = result.description(truth, joint.metric)
    describe(run.client, run.run_id, description, cfg.name, version)
    say(description.split("\n\n")[1])
    return TrainOutcome(result, run.run_id, version, info.model_uri, run.experiment_name, f"{joint.metric}, {truth}")


def _refuse_search_options(request: TrainRequest) -> None:
    """A governor of configurations is chosen by an exhaustive grid held out by task: Optuna's options (trials, seed,
    study, storage) and another CV split would be ignored, so asking for them is refused in one line.

    Raises:
        DvfsError: an option of the GPU-only search given another value than its default (--cv-split task is the one
            this governor uses, so it is accepted).
    """
    from dvfs_mlops.errors import DvfsError

    default = TrainRequest()
    asked = [f"--{name.replace('_', '-')} {getattr(request, name)}" for name in ("trials", "outer_trials", "seed", "study_name", "storage")
             if getattr(request, name) != getattr(default, name)]
    if request.cv_split not in ("auto", "task"):
        asked.append(f"--cv-split {request.cv_split}")
    if asked:
        raise DvfsError(f"a governor of configurations is chosen by an exhaustive grid of trees held out one task at a time; "
                        f"{', '.join(asked)} would be ignored: drop {'it' if len(asked) == 1 else 'them'} (those options tune the "
                        "GPU-only governor's Optuna search)")


def dataset_family(dataset: GovernorDataset | JointDataset) -> str:
    """The board family a dataset's sweeps measured (their board record's; a record-less sweep's from its profile)."""
    from dvfs_mlops.mlops.registry import version_family

    board = getattr(dataset, "board", None)
    return board.family if board is not None and board.family else version_family({schema.TAG_VERSION_PROFILE: dataset.device_profile})


def _prior_tag(dataset: GovernorDataset, say: Callable[[str], None]) -> dict[str, str]:
    """The version's `power_prior` tag (the sweep's board prior, for refine at launch), and a line saying so."""
    prior = board_power_prior(dataset)
    if prior is None:
        from dvfs_mlops.model.power_prior import MIN_CLOCKS, MIN_WORKLOADS

        say(f"no power prior for refine: it needs at least {MIN_WORKLOADS} workloads with {MIN_CLOCKS} or more clocks "
            "and their GPU utilisation")
        return {}
    say(f"power prior for refine: {prior.workloads} workloads, idle share {prior.idle_share:g}, "
        f"log dynamic/static ratio {prior.log_ratio_mean:.3f} +- {prior.log_ratio_sd:.3f}")
    return {schema.TAG_VERSION_POWER_PRIOR: prior.to_json()}


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


def _trial_logger(c: MlflowClient, parent_run_id: str, experiment_id: str) -> Callable[[TrialRecord], None]:
    """Each finished trial of the selection study as a run nested under the governor's training run."""

    def log_trial(trial: TrialRecord) -> None:
        tags = {schema.TAG_OPTUNA_STUDY: trial.study_name, schema.TAG_OPTUNA_TRIAL: str(trial.number)}
        with lifecycle.owned_run(schema.GOVERNOR_EXPERIMENT, experiment_id=experiment_id, name=f"trial {trial.number}", tags=tags,
                                 parent_id=parent_run_id, client=c) as run:
            run.log_batch(params=trial.params, metrics={"inner_regret": trial.inner_regret, "inner_accuracy": trial.inner_accuracy})

    return log_trial
