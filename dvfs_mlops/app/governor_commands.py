"""The governor's life cycle on the command line: `train`, `evaluate` and `registry list/bootstrap/promote/rollback`.

Each function does a command's work and returns what the command prints (lines, and the MLflow UI link lines),
so the command line only prints them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.app.links import production_link_lines, run_link_lines, version_link_lines
from dvfs_mlops.mlops import schema

if TYPE_CHECKING:
    from dvfs_mlops.mlops.evaluate import EvalReport, EvaluateRequest
    from dvfs_mlops.mlops.registry import RegistryConfig
    from dvfs_mlops.mlops.train import TrainOutcome, TrainRequest
    from dvfs_mlops.model.governor.configurations import ConfigurationResult
    from dvfs_mlops.model.governor.search import CVScore


def _quiet(_message: str) -> None:
    """A `say` that says nothing."""


@dataclasses.dataclass(frozen=True)
class TrainReport:
    """What `dvfs-mlops train` did: the trained (and maybe registered) governor, and the MLflow UI link lines."""

    outcome: TrainOutcome
    link: list[str]

    def lines(self) -> list[str]:
        """The held-out regret table (governor, FFG, paper-mlg per split), the chosen tree, the version made."""
        from dvfs_mlops.model.governor.configurations import ConfigurationResult
        from dvfs_mlops.model.governor.policy_tree import features_used, tree_depth

        r = self.outcome.result
        if isinstance(r, ConfigurationResult):
            return [*_configuration_lines(r, self.outcome.truth), *self._version_lines()]
        truth = "expected (noise-free) curves, SIMULATED" if r.expected_truth else "mean-over-repeats curves"
        lines = [f"held-out regret (nested CV, against {truth}; mean [95% CI] over workloads):",
                 f"{'split':<16} {'governor':>22} {'FFG':>22} {'paper-mlg':>22}"]
        for split, ns in r.nested.items():
            mark = " *" if split == r.split else ""
            lines.append(f"{'one ' + split + mark:<16} {_cell(ns.governor):>22} {_cell(ns.ffg):>22} {_cell(ns.paper):>22}")
        lines.append(f"(* the split gates read; selection study {r.study_name}: inner regret {100 * r.tree.regret:.2f}%, optimistic)")
        tree = r.policy.policy["tree"]
        used = sorted(features_used(tree))
        lines.append(f"best governor: {r.family} tree, depth {tree_depth(tree)}, splits on {', '.join(used) or 'nothing (one clock for all)'} "
                     f"(offered: {', '.join(r.best_params.features)})")
        return lines + self._version_lines()

    def _version_lines(self) -> list[str]:
        out = self.outcome
        if out.version is not None:
            return [(f"registered dvfs-governor v{out.version} (run {out.run_id} in {out.experiment}); promote it with: "
                     f"dvfs-mlops registry promote {out.version}")]
        return [f"logged {out.model_uri} (not registered)"]


def _configuration_lines(r: ConfigurationResult, truth: str) -> list[str]:
    """A governor of configurations' held-out regret (the tree, the fixed configuration) against `truth` (the energy
    metric, SIMULATED where the twin's), and what it is."""
    import numpy as np

    from dvfs_mlops.model.governor.configurations import ci

    def cell(regrets: Any) -> str:
        lo, hi = ci(regrets)
        return f"{100 * float(np.mean(regrets)):6.2f}% [{100 * lo:5.2f},{100 * hi:5.2f}]"

    g = r.governor
    what = (f"a tree of depth {g.depth} (min leaf {g.min_leaf}) over {len(g.settings)} configurations" if g.tree is not None
            else f"one fixed configuration, {g.settings[g.fixed].label()}" + (" (the floor: the tree did no better held out)" if r.floored else ""))
    return [(f"held-out regret against the joint oracle on {truth} (nested CV, one task out, {r.n_groups} folds; mean [95% CI] "
             "over workloads):"),
            f"{'governor of configurations':<28} {cell(r.governor_regret):>22}", f"{'fixed configuration':<28} {cell(r.fixed_regret):>22}",
            f"registered governor: {what}"]


def _cell(score: CVScore) -> str:
    """One split's regret with its 95% interval, as a table cell."""
    lo, hi = score.ci
    return f"{100 * score.regret:6.2f}% [{100 * lo:5.2f},{100 * hi:5.2f}]"


def train(request: TrainRequest, say: Callable[[str], None] = _quiet) -> TrainReport:
    """`dvfs-mlops train`: train the governor on the request's sweeps and register it (`mlops.train.train_governor`).

    Args:
        request: what to train on and how.
        say: where progress lines go.

    Returns:
        The `TrainReport` (its link: the new version's page, else the run's).

    Raises:
        DvfsError: as `train_governor`.
    """
    from dvfs_mlops.mlops.train import train_governor

    out = train_governor(request, say=say)
    link = version_link_lines(out.version) if out.version is not None else run_link_lines(out.run_id)
    return TrainReport(out, link)


@dataclasses.dataclass(frozen=True)
class EvaluationReport:
    """What `dvfs-mlops evaluate` found, and the MLflow UI link lines of the run it logged."""

    report: EvalReport
    link: list[str]

    def table(self) -> str:
        """The savings and regret table."""
        from dvfs_mlops.mlops.evaluate import format_table

        return format_table(self.report)


def evaluate(request: EvaluateRequest, say: Callable[[str], None] = _quiet) -> EvaluationReport:
    """`dvfs-mlops evaluate`: compare policies on a sweep's measured points and log the comparison.

    Args:
        request: the sweep, its split, the policies and the objective.
        say: where progress lines go.

    Returns:
        The `EvaluationReport`.

    Raises:
        DvfsError: as `mlops.evaluate.evaluate_sweep`.
    """
    from dvfs_mlops.mlops.evaluate import evaluate_sweep

    r = request
    report = evaluate_sweep(r.sweep_id or None, r.experiment, r.split, r.policy_names, r.objective, say=say)
    return EvaluationReport(report, run_link_lines(report.run_id) if report.run_id else [])


def version_lines(versions: Sequence[dict[str, Any]]) -> list[str]:
    """`registry list`: one line per version (board family, aliases, objective, profile, sweep, held-out regret or what
    it was calibrated from; a governor of configurations' clocks and energy metric), or a hint when none."""
    if not versions:
        return ["no governor versions yet: run `dvfs-mlops train` or `dvfs-mlops registry bootstrap`"]
    lines = []
    for v in versions:
        m, tags = v["metrics"], v["tags"]
        if tags.get(schema.TAG_CALIBRATED_FROM):
            regret = (f"calibrated from v{tags[schema.TAG_CALIBRATED_FROM]} on {tags.get(schema.TAG_CALIBRATION_SWEEP) or '?'}"
                      + (f", regret {100 * m['calibration_regret']:.2f}% on its workloads" if "calibration_regret" in m else ""))
        else:
            regret = f"held-out regret {100 * m['tree_outer_regret']:.2f}%" if "tree_outer_regret" in m else "no CV figures"
        if tags.get(schema.TAG_VERSION_KNOBS, "gpu") != "gpu":  # a governor of configurations: against the joint oracle
            regret += f" (decides {tags[schema.TAG_VERSION_KNOBS]}, on {tags.get(schema.TAG_VERSION_ENERGY_METRIC) or 'its energy'})"
        aliases = ",".join(sorted(v["aliases"])) or "-"
        lines.append(f"v{v['version']:<3} {v.get('family', '?'):<24} {aliases:<20} {tags.get(schema.TAG_OBJECTIVE, '?'):<8} "
                     f"{tags.get(schema.TAG_VERSION_PROFILE, '?'):<22} sweep {tags.get('sweep_id') or '-':<18} {regret}")
    return lines


def bootstrap(say: Callable[[str], None] = _quiet) -> list[str]:
    """`registry bootstrap`: register the published tree as a version.

    Args:
        say: where progress lines go.

    Returns:
        The MLflow UI link lines of the new version.
    """
    from dvfs_mlops.mlops.registry import bootstrap as register_published

    return version_link_lines(register_published(say=say))


def promote(version: str, force: bool = False, say: Callable[[str], None] = _quiet, family: str = "") -> list[str]:
    """`registry promote`: check the gates, then alias `version` as its board family's production.

    Args:
        version: a version number or 'latest'.
        force: promote even if a gate fails.
        say: where the gates' results and the change go.
        family: the family the version must belong to ('' whichever it is).

    Returns:
        The MLflow UI link lines of the family's production version.

    Raises:
        DvfsError: no such version, a version of another family, or a failed gate without `force`.
    """
    from dvfs_mlops.mlops.registry import load_config, version_family
    from dvfs_mlops.mlops.registry import promote as promote_version

    promote_version(version, force=force, say=say, family=family)
    return _production_links(family or version_family(_version_tags(version)), load_config())


def rollback(say: Callable[[str], None] = _quiet, family: str = "") -> list[str]:
    """`registry rollback`: swap a family's production and previous back.

    Args:
        say: where the change goes.
        family: the board family ('' the legacy one's: what `production` means).

    Returns:
        The MLflow UI link lines of the family's production version.

    Raises:
        DvfsError: no previous version of the family.
    """
    from dvfs_mlops.mlops.registry import load_config
    from dvfs_mlops.mlops.registry import rollback as roll_back

    roll_back(say=say, family=family)
    cfg = load_config()
    return _production_links(family or cfg.legacy_family, cfg)


def _version_tags(version: str) -> dict[str, str]:
    from dvfs_mlops.mlops.registry import show_version

    return dict(show_version(version)["tags"])


def _production_links(family: str, cfg: RegistryConfig) -> list[str]:
    """The UI link lines of a family's production version (the legacy family's: `production`)."""
    if family == cfg.legacy_family:
        return production_link_lines()
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import alias_version

    mv = alias_version(tracking.client(), cfg.name, cfg.production_alias(family))
    return version_link_lines(mv.version) if mv is not None else []
