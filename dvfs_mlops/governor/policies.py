"""Frequency-choosing policies, one interface: `choose(features, frequencies) -> freq`.

MaxN (the default governor), Fixed (FFG: the single clock with least total cost over the
training workloads), Tree (a policy.json, ours or the published one), Oracle (the measured best;
evaluation only).
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dvfs_mlops.clocks import MAXN, FreqRequest
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.governor import policy_tree
from dvfs_mlops.governor.dataset import WorkloadCurve
from dvfs_mlops.governor.objectives import Objective
from dvfs_mlops.paths import REGISTRY_DIR_ENV, registry_dir, registry_file
from dvfs_mlops.workloads.features import WorkloadFeatures

__all__ = ["REGISTRY_DIR_ENV", "FixedPolicy", "MaxNPolicy", "OraclePolicy", "Policy", "TreePolicy", "choice_for", "paper_tree",
           "registry_dir", "registry_file"]


def _row(features: WorkloadFeatures | Mapping[str, Any]) -> Mapping[str, Any]:
    return features.as_row() if isinstance(features, WorkloadFeatures) else features


class Policy(Protocol):
    name: str

    def choose(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> FreqRequest: ...

    def explain(self, features: WorkloadFeatures | Mapping[str, Any], frequencies: Sequence[float] | None = None) -> str: ...


class MaxNPolicy:
    name = "maxn"

    def choose(self, features: Any, frequencies: Sequence[float] | None = None) -> FreqRequest:
        return MAXN

    def explain(self, features: Any, frequencies: Sequence[float] | None = None) -> str:
        return "the default load-tracking governor (maxn)"


@dataclasses.dataclass
class FixedPolicy:
    freq_mhz: float
    name: str = "ffg"

    @classmethod
    def fit(cls, curves: Sequence[WorkloadCurve], objective: Objective) -> FixedPolicy:
        """FFG: the clock with the least total cost (energy by default) summed over `curves`."""
        freqs = sorted(set.intersection(*(set(c.energy_j) for c in curves)))
        costs = [objective.costs(c.energy_j, c.time_s, c.maxn_time_s) for c in curves]

        def total(f: float) -> float:
            return sum(cost[f] if math.isfinite(cost[f]) else 2 * max(v for v in cost.values() if math.isfinite(v))
                       if any(math.isfinite(v) for v in cost.values()) else c.energy_j[f] for cost, c in zip(costs, curves))

        return cls(min(freqs, key=lambda f: (total(f), -f)))

    def choose(self, features: Any, frequencies: Sequence[float] | None = None) -> FreqRequest:
        return policy_tree.snap(self.freq_mhz, frequencies)

    def explain(self, features: Any, frequencies: Sequence[float] | None = None) -> str:
        return f"fixed frequency {self.choose(features, frequencies):g} MHz (FFG)"


@dataclasses.dataclass
class TreePolicy:
    policy: dict[str, Any]
    name: str = "tree"

    def choose(self, features: Any, frequencies: Sequence[float] | None = None) -> FreqRequest:
        freq, _ = policy_tree.decide(self.policy, _row(features))
        return policy_tree.snap(freq, frequencies)

    def explain(self, features: Any, frequencies: Sequence[float] | None = None) -> str:
        freq, path = policy_tree.decide(self.policy, _row(features))
        return policy_tree.explain(path, policy_tree.snap(freq, frequencies))

    @classmethod
    def from_file(cls, path: str | Path, name: str = "tree") -> TreePolicy:
        data = json.loads(Path(path).read_text())
        if data.get("format") != policy_tree.FORMAT:
            raise DvfsError(f"{path} is not a governor policy file (format {data.get('format')!r}, expected {policy_tree.FORMAT})")
        return cls(data, name)

    @classmethod
    def from_sklearn(cls, clf: Any, feature_names: Sequence[str], metadata: Mapping[str, Any] | None = None) -> TreePolicy:
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
        return curve.label(self.objective)


def paper_tree() -> TreePolicy:
    path = registry_file("baselines", "paper-mlg.json", what="published tree")
    return TreePolicy.from_file(path, name="paper-mlg")


def choice_for(policy: Any, curve: WorkloadCurve, frequencies: Sequence[float]) -> FreqRequest:
    """What `policy` picks for a sweep workload (the oracle looks at the measured curve)."""
    if isinstance(policy, OraclePolicy):
        return policy.choose_for(curve)
    return policy.choose(curve.features, frequencies)
