"""A governor of configurations: features -> one (GPU, CPU, EMC) configuration per workload.

It is the curve tree of the GPU-only governor with a configuration where a clock was: a regression tree
(scikit-learn's `DecisionTreeRegressor`, multi-output; or a forest of them, `RandomForestRegressor`, whose averaged
curves are smoother) from the workload's features to its cost at every configuration
of the table, each row normalised by its own least cost, so a leaf holds the mean normalised cost curve of its
workloads over every configuration and picks that curve's least. The floor it is measured against is FFG's joint
analogue: the one configuration of least mean normalised cost over the training workloads (`fixed_configuration`).
Its depth and leaf size are chosen by cross-validation over held-out groups (`fit_configuration_tree`), and its
held-out regret is a nested cross-validation's (`nested_regret`): every group held out in turn, the hyper-parameters
chosen on the others only.

Costs are whatever the caller judges policies on: on the twin, the noise-free joint energy (`SimDevice.expected`'s
`energy_joint_expected_j`, the rails the CPU and memory clocks feed included). numpy and scikit-learn only.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvfs_mlops.clocks import Setting
from dvfs_mlops.errors import DvfsError

DEPTHS = (1, 2, 3, 4, 6)
MIN_LEAVES = (1, 2, 3, 5)
FOREST_TREES = 40  # a forest's trees (bootstrapped, every feature per split): its leaves' curves averaged


@dataclasses.dataclass(frozen=True)
class ConfigurationTable:
    """Workloads' costs at every configuration of a table.

    Attributes:
        settings: the configurations (columns).
        workloads: the workloads' names (rows).
        features: each workload's numeric features (rows x features).
        feature_names: the features' names.
        cost: each workload's cost at each configuration (rows x columns), > 0.
        groups: each workload's cross-validation group (a task, a model: what is held out together).

    Raises:
        DvfsError: shapes that disagree, or a cost that is not a finite number > 0.
    """

    settings: tuple[Setting, ...]
    workloads: tuple[str, ...]
    features: np.ndarray
    feature_names: tuple[str, ...]
    cost: np.ndarray
    groups: tuple[str, ...]

    def __post_init__(self) -> None:
        n, k = len(self.workloads), len(self.settings)
        if self.cost.shape != (n, k) or self.features.shape != (n, len(self.feature_names)) or len(self.groups) != n:
            raise DvfsError(f"a configuration table needs {n} workloads x {k} configurations of cost, {n} rows of "
                            f"{len(self.feature_names)} features and {n} groups")
        if not (np.isfinite(self.cost).all() and (self.cost > 0).all()):
            raise DvfsError("every cost of a configuration table is a finite number > 0")

    @property
    def normalised(self) -> np.ndarray:
        """Each row divided by its least cost (1.0 at each workload's optimum)."""
        return self.cost / self.cost.min(axis=1, keepdims=True)

    def subset(self, rows: Sequence[int]) -> ConfigurationTable:
        idx = list(rows)
        return dataclasses.replace(self, workloads=tuple(self.workloads[i] for i in idx), features=self.features[idx],
                                   cost=self.cost[idx], groups=tuple(self.groups[i] for i in idx))


@dataclasses.dataclass(frozen=True)
class ConfigurationTree:
    """A fitted governor of configurations.

    Attributes:
        settings: the configurations it picks from.
        tree: the fitted regression tree (None for one fixed configuration).
        fixed: the configuration's column where `tree` is None.
        depth, min_leaf: its hyper-parameters (0, 0 for a fixed configuration).
        kind: "tree", "forest" or "fixed".
    """

    settings: tuple[Setting, ...]
    tree: Any
    fixed: int = 0
    depth: int = 0
    min_leaf: int = 0
    kind: str = "fixed"

    def pick_index(self, features: np.ndarray) -> np.ndarray:
        """Each row's configuration column: the least of its leaf's mean normalised cost."""
        if self.tree is None:
            return np.full(len(features), self.fixed)
        return np.asarray(self.tree.predict(features)).argmin(axis=1)

    def pick(self, features: np.ndarray) -> list[Setting]:
        """Each row's configuration."""
        return [self.settings[i] for i in self.pick_index(features)]


def fixed_configuration(table: ConfigurationTable) -> ConfigurationTree:
    """FFG's joint analogue: the one configuration of least mean normalised cost over the table's workloads."""
    return ConfigurationTree(table.settings, None, int(table.normalised.mean(axis=0).argmin()))


def _tree(table: ConfigurationTable, depth: int, min_leaf: int, kind: str = "tree", seed: int = 0) -> ConfigurationTree:
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.tree import DecisionTreeRegressor

    model = (DecisionTreeRegressor(max_depth=depth, min_samples_leaf=min_leaf, random_state=seed) if kind == "tree" else
             RandomForestRegressor(FOREST_TREES, max_depth=depth, min_samples_leaf=min_leaf, max_features=1.0, random_state=seed))
    model.fit(table.features, table.normalised)
    return ConfigurationTree(table.settings, model, depth=depth, min_leaf=min_leaf, kind=kind)


def regret(table: ConfigurationTable, governor: ConfigurationTree) -> np.ndarray:
    """Each workload's regret: cost(pick) / cost(its optimum) - 1."""
    picks = governor.pick_index(table.features)
    return table.normalised[np.arange(len(picks)), picks] - 1.0


def _held_out(table: ConfigurationTable, make: Any) -> np.ndarray:
    """Leave-one-group-out: each group's regret under the governor `make` fits on the other groups."""
    out = np.zeros(len(table.workloads))
    for group in sorted(set(table.groups)):
        test = [i for i, g in enumerate(table.groups) if g == group]
        train = [i for i, g in enumerate(table.groups) if g != group]
        out[test] = regret(table.subset(test), make(table.subset(train)))
    return out


def fit_configuration_tree(table: ConfigurationTable, depths: Sequence[int] = DEPTHS, min_leaves: Sequence[int] = MIN_LEAVES,
                           kinds: Sequence[str] = ("tree", "forest")) -> ConfigurationTree:
    """The tree or forest whose depth and leaf size give the least mean held-out regret over the table's groups (ties:
    the first, simpler, candidate), or the fixed configuration where none beats it; fitted on the whole table.

    Raises:
        DvfsError: fewer than two groups (nothing to hold out).
    """
    if len(set(table.groups)) < 2:
        raise DvfsError("a governor of configurations is chosen by holding groups out: give at least two groups")
    best = (float(_held_out(table, fixed_configuration).mean()), 0, 0, "fixed")
    for kind, depth, leaf in itertools.product(kinds, depths, min_leaves):
        score = float(_held_out(table, lambda t, d=depth, m=leaf, k=kind: _tree(t, d, m, k)).mean())
        if score < best[0] - 1e-12:
            best = (score, depth, leaf, kind)
    return fixed_configuration(table) if best[1] == 0 else _tree(table, best[1], best[2], best[3])


def nested_regret(table: ConfigurationTable) -> tuple[np.ndarray, np.ndarray]:
    """Held-out regret of the governor and of the fixed configuration, per workload: each group held out in turn,
    the governor's hyper-parameters chosen on the other groups only (by their own held-out groups).

    Returns:
        (the governor's regret per workload, the fixed configuration's).
    """
    governor = _held_out(table, fit_configuration_tree)
    fixed = _held_out(table, fixed_configuration)
    return governor, fixed


def summary(values: np.ndarray) -> tuple[float, float]:
    """(mean, max) of a regret array."""
    return float(np.mean(values)), float(np.max(values)) if len(values) else math.nan
