"""Frequency-choosing policies, one interface: `choose(features, frequencies) -> freq`.

MaxN (the default governor), Fixed (FFG: the single clock with least mean normalised cost over
the training workloads), Tree (a policy.json, ours or the published one: classifier or curve
leaves), Oracle (the true best: expected curve where logged, else mean over repeats; evaluation only).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dvfs_mlops.clocks import MAXN, FreqRequest
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.model.governor import policy_tree
from dvfs_mlops.model.governor.curve_tree import kept
from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.workload import WorkloadFeatures
from dvfs_mlops.settings import registry_file

if TYPE_CHECKING:
    from sklearn.tree import DecisionTreeClassifier

__all__ = ["FixedPolicy", "MaxNPolicy", "OraclePolicy", "Policy", "TreePolicy", "choice_for", "paper_tree"]


def _row(features: WorkloadFeatures | Mapping[str, Any]) -> Mapping[str, Any]:
    return features.as_row() if isinstance(features, WorkloadFeatures) else features


class Policy(Protocol):
    name: str

    def choose(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> FreqRequest: ...

    def explain(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> str: ...


class MaxNPolicy:
    name = "maxn"

    def choose(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> FreqRequest:
        return MAXN

    def explain(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> str:
        return "the default load-tracking governor (maxn)"


@dataclasses.dataclass
class FixedPolicy:
    freq_mhz: float
    name: str = "ffg"

    @classmethod
    def fit(cls, curves: Sequence[WorkloadCurve], objective: Objective) -> FixedPolicy:
        """FFG: the clock with the least mean normalised cost (cost/least cost, per workload) over `curves`.

        Normalised per workload, so the largest models do not decide it alone; measured curves (all hardware
        gives). A workload that lacks a clock is charged its nearest measured one, as evaluation does."""
        freqs = tuple(sorted(set().union(*(c.energy_j for c in curves))))
        totals = np.zeros(len(freqs))
        for c in curves:
            totals += kept(c, ("ffg-costs", objective, freqs), lambda c=c: _normalised_costs(c, objective, freqs))  # type: ignore[misc]
        return cls(min(freqs, key=lambda f: (totals[freqs.index(f)], -f)))

    def choose(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> FreqRequest:
        return policy_tree.snap(self.freq_mhz, frequencies)

    def explain(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> str:
        return f"fixed frequency {self.choose(features, frequencies):g} MHz (FFG)"


def _normalised_costs(curve: WorkloadCurve, objective: Objective, freqs: Sequence[float]) -> np.ndarray:
    """The workload's cost at each of `freqs` (its nearest measured clock) over its least cost; an infeasible clock
    costs twice the worst feasible one; nothing feasible: judged by energy."""
    costs = objective.costs(curve.energy_j, curve.time_s, curve.maxn_time_s)
    finite = [v for v in costs.values() if math.isfinite(v)]
    if not finite:
        costs, finite = dict(curve.energy_j), list(curve.energy_j.values())
    lo, worst = min(finite), 2 * max(finite)
    return np.asarray([(v if math.isfinite(v) else worst) / lo for v in (costs[curve.nearest(f)] for f in freqs)])


@dataclasses.dataclass
class TreePolicy:
    policy: dict[str, Any]
    name: str = "tree"

    objective: str | None = None  # a curve policy's decision-time objective (None: the policy's own)

    def choose(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> FreqRequest:
        freq, _ = policy_tree.decide(self.policy, _row(features), self.objective)
        return policy_tree.snap(freq, frequencies)

    def explain(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> str:
        freq, path = policy_tree.decide(self.policy, _row(features), self.objective)
        return policy_tree.explain(path, policy_tree.snap(freq, frequencies))

    @classmethod
    def from_file(cls, path: str | Path, name: str = "tree") -> TreePolicy:
        data = json.loads(Path(path).read_text())
        if data.get("format") != policy_tree.FORMAT:
            raise DvfsError(f"{path} is not a governor policy file (format {data.get('format')!r}, expected {policy_tree.FORMAT})")
        return cls(data, name)

    @classmethod
    def from_sklearn(cls, clf: DecisionTreeClassifier, feature_names: Sequence[str], metadata: Mapping[str, Any] | None = None) -> TreePolicy:
        t = clf.tree_

        def node(i: int) -> dict[str, Any]:
            if t.children_left[i] == t.children_right[i]:  # leaf
                counts = t.value[i][0]
                return {"freq_mhz": float(clf.classes_[int(counts.argmax())]), "samples": int(t.n_node_samples[i])}
            return {"feature": feature_names[int(t.feature[i])], "threshold": round(float(t.threshold[i]), 6),
                    "left": node(int(t.children_left[i])), "right": node(int(t.children_right[i]))}

        return cls({"format": policy_tree.FORMAT, **(metadata or {}), "tree": node(0)})


class OraclePolicy:
    """The measured best clock of a workload of the sweep; it needs the curve, not just features."""

    name = "oracle"

    def __init__(self, objective: Objective):
        self.objective = objective

    def choose_for(self, curve: WorkloadCurve) -> float:
        """The true best: on the expected curve where the twin logged it, else on the mean over repeats."""
        return curve.true_label(self.objective)


def paper_tree() -> TreePolicy:
    path = registry_file("baselines", "paper-mlg.json", what="published tree")
    return TreePolicy.from_file(path, name="paper-mlg")


def choice_for(policy: Policy, curve: WorkloadCurve, frequencies: Sequence[float]) -> FreqRequest:
    """What `policy` picks for a sweep workload, among the clocks that workload measured (the oracle looks at the curve)."""
    if isinstance(policy, OraclePolicy):
        return policy.choose_for(curve)
    return policy.choose(curve.features, curve.clocks or frequencies)
