"""`dvfs-mlops calibrate`: another board family's governor moved to this board from a few measured points.

The source is the production governor of another family trained on the most workloads (or `--source VERSION`). The
transfer model (`model/governor/transfer.py`) picks at most 3 workloads and at most 4 clocks of this board's table;
they are measured with the sweep machinery (one sweep per model, its tasks, those clocks and maxn: MLflow runs,
resumable, the same sweep id on a re-run), read back as curves (`mlops.dataset`), and the source's policy is
re-expressed on this board: its splits (what it learnt about workloads) kept, its leaves' curves moved by the board
constants fitted from the calibration points. The result is registered as a version of this board's family, tagged
with its source version and its calibration sweep(s), and promoted to `production-<family>` if it passes the
calibrated gates of governor.yaml, where the family has no production version yet or when asked (`promote=True`); a
family's production is never replaced unasked, and `promote=False` never promotes. The version's run (in
dvfs-governor) exists from the calibration's start (`lifecycle.owned_run`); the calibration sweeps' parent runs are
marked as such (`dvfs.sweep_kind`), so `train` and `evaluate` never take one for their default sweep.

What the gates read (metrics of the version's run): `calibration_regret`, the calibrated policy's mean regret on the
calibration workloads (the oracle and each choice among the clocks measured, a choice between them at its nearest:
`evaluate.evaluate_dataset`, against the expected curve on the twin), and `calibration_source_regret`, the source
governor's on the same points (its clocks snapped to this board's table: what --allow-other-board would run).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import lifecycle, schema, tracking
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.mlops.lifecycle import OwnedRun
    from dvfs_mlops.mlops.registry import RegistryConfig
    from dvfs_mlops.model.governor.dataset import GovernorDataset

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CalibrationRequest:
    """What `dvfs-mlops calibrate` is asked (besides the device).

    Attributes:
        source: the source version's number ('': the production governor of another family trained on the most
            workloads).
        preset: the sweep preset whose models and tasks are the candidate workloads (and whose settings measure them).
        steps: training steps per point (None: the preset's; 0 on the twin: profile only).
        batch_size: examples per training step.
        experiment: where the calibration sweeps' runs go.
        promote: promote the new version to `production-<family>` when it passes the gates: None where the family has
            no production version yet (never replacing one unasked), True also where it has one, False never.
    """

    source: str = ""
    preset: str = "quick"
    steps: int | None = None
    batch_size: int = 16
    experiment: str = SWEEP_EXPERIMENT
    promote: bool | None = None


@dataclasses.dataclass(frozen=True)
class CalibrationOutcome:
    """What a calibration did.

    Attributes:
        family: this board's family.
        source_version: the version calibrated from.
        source_family: its family.
        workloads: the workloads measured.
        clocks_mhz: the clocks each was measured at (maxn besides).
        sweep_ids: the calibration sweeps (one per model).
        points_run: points this run measured (0 where every point was already finished: a resumed calibration).
        version: the registered version.
        run_id: its run in the governor experiment.
        metrics: what the gates read (`calibration_regret`, `calibration_source_regret`, ...).
        promoted: it is now `production-<family>`.
        gate_lines: the gates' results as `promote` said them.
        kept: the family's production version that was kept (not promoted over: no --promote), else None.
    """

    family: str
    source_version: int
    source_family: str
    workloads: tuple[str, ...]
    clocks_mhz: tuple[float, ...]
    sweep_ids: tuple[str, ...]
    points_run: int
    version: int
    run_id: str
    metrics: dict[str, float]
    promoted: bool
    gate_lines: tuple[str, ...] = ()
    kept: int | None = None


def pick_source(c: MlflowClient, cfg: RegistryConfig, family: str, version: str = "") -> ModelVersion:
    """The version to calibrate from: `version`, else the production governor of another family trained on the most
    workloads (a trained version before a calibrated one at the same count, then the newest).

    Raises:
        DvfsError: no production GPU-only governor of another family (or `version` is of this family, is a governor
            of configurations, or does not exist).
    """
    from dvfs_mlops.mlops.registry import ensure_families, get_version, richest_production, version_family, version_knobs

    ensure_families(c, cfg)
    if version:
        mv = get_version(c, cfg.name, version)
        if version_family(mv.tags, cfg.legacy_family) == family:
            raise DvfsError(f"{cfg.name} v{mv.version} is already a governor of {family}; calibrate from another board's")
        if version_knobs(mv.tags) != "gpu":
            raise DvfsError(f"{cfg.name} v{mv.version} is a governor of configurations ({version_knobs(mv.tags)}); calibrate "
                            "moves a GPU-only governor: give a GPU-only version, or train one on this board's joint sweep")
        return mv
    other = richest_production(c, cfg, family, knobs="gpu")  # a governor of configurations is not moved
    if other is None:
        raise DvfsError(_no_source(cfg, family))
    return other[1]


def _no_source(cfg: RegistryConfig, family: str) -> str:
    """What to run first where no other board family has a production governor to calibrate from."""
    said = f"no production governor of another board family to calibrate {family} from (calibrate moves another board's governor to this one)"
    if family == cfg.legacy_family:  # the published tree is this family's own: bootstrapping it gives nothing to move
        return (f"{said}; {family} trains its own: dvfs-mlops sweep, dvfs-mlops train, dvfs-mlops registry promote latest "
                "(or make run), then calibrate the other boards from it (e.g. --twin-profile sim-orin-nano-8gb)")
    return (f"{said}; promote one first: dvfs-mlops registry bootstrap, then dvfs-mlops registry promote latest (the published "
            f"tree of {cfg.legacy_family}), or train and promote one on another board's sweep")


def candidates(preset: str) -> list[str]:
    """The workloads a preset can run, as sweeps name them (`MODEL/TASK`)."""
    from dvfs_mlops.mlops.sweep import PRESETS

    if preset not in PRESETS:
        from dvfs_mlops.errors import unknown

        raise unknown("preset", preset, list(PRESETS))
    p = PRESETS[preset]
    return [f"{m}/{t}" for m in p.models for t in p.tasks]


def _with_features(c: MlflowClient, mv: ModelVersion, names: list[str]) -> list[Any]:
    """The candidates, each with its features from the source version's training sweep where that sweep measured it
    (the source tree routes on the features its own board measured); a bare name otherwise."""
    sweep = str(mv.tags.get(schema.TAG_VERSION_SWEEP) or "")
    if not sweep:
        return list(names)
    from dvfs_mlops.mlops.dataset import load_sweep_dataset

    try:
        known = {cv.workload: cv.features for cv in load_sweep_dataset(sweep, SWEEP_EXPERIMENT, mix_profiles=True).curves}
    except DvfsError as e:  # the source's sweep is not in this store (a version copied from elsewhere): names only
        log.info("calibrate: the source's sweep %s is not readable here (%s); workloads picked by name", sweep, e)
        return list(names)
    return [(n, known[n]) if n in known else n for n in names]


def grid_candidates(device: ReplayDevice) -> list[Any]:
    """A replay device's candidates: every workload of its grid with its features from the file's columns (a replayed
    calibration picks among what the grid measured; presets do not apply)."""
    from dvfs_mlops.mlops.sweep.replayed import features_of_grid

    grid = device.grid
    return [(w, features_of_grid(grid, w)) for w in grid.workloads]


def _by_model(workloads: tuple[str, ...]) -> dict[str, list[str]]:
    """{model: [tasks]} of `MODEL/TASK` names, in order: one sweep per model measures exactly its tasks."""
    out: dict[str, list[str]] = {}
    for w in workloads:
        model, _, task = w.partition("/")
        out.setdefault(model, []).append(task)
    return out


def measure(device: Device, board: Board, request: CalibrationRequest, workloads: tuple[str, ...], clocks: tuple[float, ...],
            say: Callable[[str], None]) -> tuple[list[str], int]:
    """The calibration sweeps: per model, its tasks at `clocks` and maxn (resumable: a re-run finds them finished).

    Returns:
        (the sweep ids, the points this call ran).
    """
    from dvfs_mlops.clocks import freq_label
    from dvfs_mlops.mlops import sweep as sweep_mod
    from dvfs_mlops.mlops.claims import open_claims

    claims = open_claims(None, tracking.tracking_uri())
    ids, ran = [], 0
    options = sweep_mod.RunOptions(announce=say, claims=claims, adopt_run=False,
                                   parent_tags={schema.TAG_SWEEP_KIND: schema.CALIBRATION_SWEEP})
    if device.name == "replay":  # one sweep of the grid's chosen workloads, looked up
        req = sweep_mod.SweepRequest(workloads=",".join(workloads), freqs=",".join(freq_label(f) for f in clocks),
                                     experiment=request.experiment, steps=request.steps)
        out = sweep_mod.run_sweep(sweep_mod.build_spec(board, req, device, grid=cast("ReplayDevice", device).grid), device, board,
                                  options)
        return [out.sweep_id], len(out.ran)
    for model, tasks in _by_model(workloads).items():
        req = sweep_mod.SweepRequest(preset=request.preset, models=model, tasks=",".join(tasks),
                                     freqs=",".join(freq_label(f) for f in clocks), steps=request.steps,
                                     batch_size=request.batch_size, experiment=request.experiment)
        spec = sweep_mod.build_spec(board, req)
        out = sweep_mod.run_sweep(spec, device, board, options)
        ids.append(out.sweep_id)
        ran += len(out.ran)
    return ids, ran


def calibration_metrics(dataset: GovernorDataset, source_policy: dict[str, Any], calibrated: dict[str, Any], objective: str) -> dict[str, float]:
    """What the calibrated gates read: both policies' mean regret on the calibration points (`evaluate_dataset`)."""
    from dvfs_mlops.mlops.evaluate import GovernorPolicy, evaluate_dataset
    from dvfs_mlops.mlops.governor import Governor, GovernorRef, PolicyModel
    from dvfs_mlops.model.governor.objectives import parse_objective

    obj = parse_objective(objective)
    policies = {name: GovernorPolicy(Governor(GovernorRef(name), PolicyModel(policy)), name, obj.name)
                for name, policy in (("calibrated", calibrated), ("source", source_policy))}
    report = evaluate_dataset(dataset, policies, obj, split="all")
    by = {s.policy: s for s in report.summaries}
    regret = {k: (s.mean_regret_expected if s.mean_regret_expected is not None else s.mean_regret) for k, s in by.items()}
    out = {"calibration_regret": regret["calibrated"], "calibration_source_regret": regret["source"],
           "calibration_saving": by["calibrated"].mean_saving, "calibration_workloads": float(len(dataset.curves)),
           "calibration_points": float(sum(len(cv.energy_j) for cv in dataset.curves))}
    constants = calibrated.get("board_constants") or {}
    out.update({f"board_{k}": float(v) for k, v in constants.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


def register(run: OwnedRun, policy: dict[str, Any], board: Board, source: ModelVersion, sweep_ids: list[str],
             metrics: dict[str, float], simulated: bool, say: Callable[[str], None]) -> int:
    """The calibrated policy as a version of this board's family, tagged with its source and calibration sweep(s),
    logged into `run` (the calibration's, MLflow's active run).

    Returns:
        The version.
    """
    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.mlops.registry import load_config
    from dvfs_mlops.model.curve import PowerPrior

    cfg = load_config()
    sweeps = ",".join(sweep_ids)
    tags = {schema.TAG_OBJECTIVE: str(policy.get("objective", "energy")), schema.TAG_VERSION_PROFILE: board.profile,
            schema.TAG_VERSION_SWEEP: sweeps[:4900], schema.TAG_N_WORKLOADS: str(source.tags.get(schema.TAG_N_WORKLOADS) or ""),
            schema.TAG_SIMULATED: str(simulated).lower(), schema.TAG_BOARD_FAMILY: board.family,
            schema.TAG_CALIBRATED_FROM: str(source.version), schema.TAG_CALIBRATION_SWEEP: sweeps[:4900],
            schema.TAG_FAMILY: str(policy.get("family", "curve"))}
    prior = policy.get("power_prior")
    if isinstance(prior, dict):
        tags[schema.TAG_VERSION_POWER_PRIOR] = PowerPrior(**prior).to_json()
    run.log_batch(tags=tags)
    info = log_governor(policy, registered_name=cfg.name, metrics=metrics, tags=tags, version_tags=tags)
    version = int(info.registered_model_version)
    say(f"registered {cfg.name} v{version} for {board.family}, calibrated from v{source.version} on {sweeps}")
    return version


def calibrate_board(device: Device, board: Board, request: CalibrationRequest,
                    say: Callable[[str], None] = log.info) -> CalibrationOutcome:
    """Calibrate another family's governor for `board`: plan, measure, fit, register, promote (where the family has no
    production version yet, or asked).

    Args:
        device: the open device (its clocks are pinned by the calibration sweep's points).
        board: its `Board`.
        request: the source, the candidate preset, the steps, whether to promote.
        say: where progress goes.

    Returns:
        The `CalibrationOutcome`.

    Raises:
        DvfsError: no source governor, a source that is not a curve or classifier tree readable here, a failed sweep
            point, no calibration curve the transfer can use, or (promoting) a failed gate (the version stays registered).
    """
    from dvfs_mlops.mlops.governor import load_governor
    from dvfs_mlops.mlops.registry import load_config, version_family

    cfg = load_config()
    c = tracking.check_reachable()
    source = pick_source(c, cfg, board.family, request.source)
    source_family = version_family(source.tags, cfg.legacy_family)
    governor = load_governor(f"models:/{cfg.name}/{source.version}")
    source_policy = getattr(governor.model, "policy", None)
    if not isinstance(source_policy, dict):
        raise DvfsError(f"{cfg.name} v{source.version} is not this package's governor code, so its policy cannot be moved; "
                        "pick another with --source")
    name = f"calibrate {board.family} from v{source.version}"
    with lifecycle.owned_run(schema.GOVERNOR_EXPERIMENT, name=name, client=c, fluent=True) as run:
        fitted = _fit(c, device, board, request, source, source_policy, f"{cfg.name} v{source.version} ({source_family})", say)
        version = register(run, fitted.policy, board, source, fitted.sweep_ids, fitted.metrics, fitted.simulated, say)
    promoted, kept, gate_lines = _maybe_promote(c, cfg, board.family, version, request.promote, say)
    return CalibrationOutcome(board.family, int(source.version), source_family, fitted.workloads, fitted.clocks_mhz,
                              tuple(fitted.sweep_ids), fitted.points_run, version, run.run_id, fitted.metrics, promoted,
                              tuple(gate_lines), kept)


@dataclasses.dataclass(frozen=True)
class _Fitted:
    """A calibration measured and fitted, before it is registered."""

    policy: dict[str, Any]
    workloads: tuple[str, ...]
    clocks_mhz: tuple[float, ...]
    sweep_ids: list[str]
    points_run: int
    metrics: dict[str, float]
    simulated: bool


def _fit(c: MlflowClient, device: Device, board: Board, request: CalibrationRequest, source: ModelVersion, source_policy: dict[str, Any],
         source_label: str, say: Callable[[str], None]) -> _Fitted:
    """Plan the calibration points, measure them (the calibration sweeps), read them back and move the policy."""
    from dvfs_mlops.mlops.dataset import load_sweep_dataset
    from dvfs_mlops.mlops.sweep.progress import device_label
    from dvfs_mlops.model.governor.transfer import calibrate_policy, plan_calibration

    cands = grid_candidates(cast("ReplayDevice", device)) if device.name == "replay" else _with_features(c, source, candidates(request.preset))
    plan = plan_calibration(source_policy, board, cands)
    shown = ", ".join(f"{f:g}" for f in plan.clocks_mhz)
    say(f"calibrating {source_label} for {board.family}: {len(plan.workloads)} workloads "
        f"({', '.join(plan.workloads)}) at {shown} MHz and maxn{device_label(board)}")
    sweep_ids, ran = measure(device, board, request, plan.workloads, plan.clocks_mhz, say)
    dataset = load_sweep_dataset(",".join(sweep_ids), request.experiment)
    learnt = {name: feats for name, feats in (x for x in cands if not isinstance(x, str)) if name in plan.workloads}
    policy = calibrate_policy(source_policy, board, dataset.curves, learnt or None)  # as the source's sweep measured them
    metrics = calibration_metrics(dataset, source_policy, policy, str(source.tags.get(schema.TAG_OBJECTIVE) or "energy"))
    say(f"calibration regret {100 * metrics['calibration_regret']:.2f}% on its {len(dataset.curves)} workloads "
        f"(the source as it is: {100 * metrics['calibration_source_regret']:.2f}%){device_label(board)}")
    return _Fitted(policy, plan.workloads, plan.clocks_mhz, sweep_ids, ran, metrics, dataset.simulated)


def _maybe_promote(c: MlflowClient, cfg: RegistryConfig, family: str, version: int, asked: bool | None,
                   say: Callable[[str], None]) -> tuple[bool, int | None, list[str]]:
    """(promoted, the production version kept instead, the gates' lines): promoted through the gates where the family
    has no production version yet or `asked`; never with `asked` False; a kept production said in one line.

    Raises:
        DvfsError: promoting, a gate failed (the version stays registered).
    """
    from dvfs_mlops.mlops.registry import alias_version, promote

    current = alias_version(c, cfg.name, cfg.production_alias(family))
    if asked is False:
        return False, None, []
    if asked is None and current is not None:
        say(f"{family} keeps its production v{current.version}: {cfg.name} v{version} is registered beside it, not promoted "
            f"(dvfs-mlops registry promote {version}, or calibrate --promote)")
        return False, int(current.version), []
    gate_lines: list[str] = []

    def said(line: str) -> None:
        gate_lines.append(line)
        say(line)

    try:
        promote(version, say=said)
    except DvfsError as e:
        raise DvfsError(f"registered {cfg.name} v{version} for {family} but did not promote it: {e} "
                        f"(dvfs-mlops registry promote {version} --force)") from None
    return True, None, gate_lines
