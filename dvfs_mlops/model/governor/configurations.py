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
        """Each row's configuration column: the least of its leaf's mean normalised cost (`least`: ties to the faster)."""
        if self.tree is None:
            return np.full(len(features), self.fixed)
        return least(np.asarray(self.tree.predict(features)), self.settings)

    def pick(self, features: np.ndarray) -> list[Setting]:
        """Each row's configuration."""
        return [self.settings[i] for i in self.pick_index(features)]


def least(values: np.ndarray, settings: Sequence[Setting]) -> np.ndarray:
    """Each row's column of least value, ties to the faster configuration (the higher GPU clock, then CPU, then EMC):
    the rule `policy_tree` decides by, so a policy.json picks what the fitted tree picks."""
    order = np.array(sorted(range(len(settings)), key=lambda j: (-settings[j].gpu_mhz, -(settings[j].cpu_mhz or 0.0),
                                                                  -(settings[j].emc_mhz or 0.0))))
    return order[np.asarray(values)[:, order].argmin(axis=1)]


def fixed_column(costs: np.ndarray, settings: Sequence[Setting]) -> int:
    """FFG's joint rule: the column of least mean normalised cost over the rows (each row over its least finite cost;
    an infeasible, infinite, cost charged twice the row's worst finite one; a row with none finite left out; ties: the
    faster configuration, `least`). What training (`fixed_configuration`) and `evaluate` both fit.

    Args:
        costs: rows x columns of cost (inf where infeasible under the objective).
        settings: the columns' configurations.
    """
    c = np.asarray(costs, dtype=float)
    finite = np.isfinite(c)
    c, finite = c[finite.any(axis=1)], finite[finite.any(axis=1)]
    if not len(c):  # nothing feasible anywhere: the fastest
        return int(least(np.zeros((1, len(settings))), settings)[0])
    worst = np.where(finite, c, -np.inf).max(axis=1, keepdims=True)
    best = np.where(finite, c, np.inf).min(axis=1, keepdims=True)
    return int(least((np.where(finite, c, 2 * worst) / best).mean(axis=0)[None, :], settings)[0])


def fixed_configuration(table: ConfigurationTable) -> ConfigurationTree:
    """FFG's joint analogue: the one configuration of least mean normalised cost over the table's workloads
    (`fixed_column`)."""
    return ConfigurationTree(table.settings, None, fixed_column(table.cost, table.settings))


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


def inner_split(n_groups: int) -> str:
    """What the nested CV's inner folds hold out with `n_groups` outer groups: the groups where at least two are left to
    choose on, else the workloads one by one (as the GPU-only search's `_inner_split`)."""
    return "task" if n_groups >= 3 else "workload"


def nested_regret(table: ConfigurationTable, kinds: Sequence[str] = ("tree", "forest")) -> tuple[np.ndarray, np.ndarray]:
    """Held-out regret of the governor and of the fixed configuration, per workload: each group held out in turn,
    the governor's hyper-parameters (and kind, among `kinds`) chosen on the other groups only, by their own held-out
    groups; where one group is left to choose on, by its workloads held out one by one (`inner_split`); where one
    workload is left, the fixed configuration.

    Returns:
        (the governor's regret per workload, the fixed configuration's).
    """
    def select(t: ConfigurationTable) -> ConfigurationTree:
        if len(set(t.groups)) < 2:
            if len(t.workloads) < 2:  # nothing to hold out: the fixed configuration
                return fixed_configuration(t)
            t = dataclasses.replace(t, groups=t.workloads)
        return fit_configuration_tree(t, kinds=kinds)

    governor = _held_out(table, select)
    fixed = _held_out(table, fixed_configuration)
    return governor, fixed


def summary(values: np.ndarray) -> tuple[float, float]:
    """(mean, max) of a regret array."""
    return float(np.mean(values)), float(np.max(values)) if len(values) else math.nan


FAMILY = "configurations"  # the policy.json family of a governor of configurations (`policy_tree`)


def to_policy(governor: ConfigurationTree, table: ConfigurationTable, slowdown: np.ndarray, objective: str = "energy",
              **meta: Any) -> dict[str, Any]:
    """The governor as a policy.json of configurations (`policy_tree`): its tree's threshold splits on the table's
    feature names, each leaf the curve of its training workloads over every configuration (mean normalised cost
    `energy`, mean time over maxn `time`, the leaf's largest such time `time_hi`), so the objective (energy, edp,
    max-slowdown:X) is applied at decision time as for a GPU curve policy. A fixed configuration is one leaf over every
    workload (its least mean cost is that configuration).

    Args:
        governor: a fitted tree or the fixed configuration (`fit_configuration_tree`, `fixed_configuration`).
        table: the table it was fitted on (its feature names are what the policy splits on: `policy_tree.feature_value`'s).
        slowdown: each workload's time at each configuration over its maxn time (rows x columns).
        objective: the objective the policy applies unless told.
        meta: more top-level keys (name, knobs, energy metric ...).

    Raises:
        DvfsError: a forest (it has no single tree of threshold splits), or a slowdown of another shape than the cost.
    """
    from dvfs_mlops.model.governor.policy_tree import FORMAT

    if governor.kind == "forest":
        raise DvfsError("a forest of configurations has no policy.json form (one tree of threshold splits); fit kinds=('tree',)")
    if slowdown.shape != table.cost.shape:
        raise DvfsError(f"slowdown is {slowdown.shape}, the table's cost {table.cost.shape}")
    norm = table.normalised

    def leaf(rows: np.ndarray, energy: np.ndarray | None = None) -> dict[str, Any]:
        # unrounded, and a tree's leaf its own stored curve: the policy then decides exactly as `pick_index` predicts
        return {"energy": [float(v) for v in (norm[rows].mean(axis=0) if energy is None else energy)],
                "time": [float(v) for v in slowdown[rows].mean(axis=0)],
                "time_hi": [float(v) for v in slowdown[rows].max(axis=0)], "samples": int(len(rows))}

    if governor.tree is None:
        tree: dict[str, Any] = leaf(np.arange(len(table.workloads)))
    else:
        t = governor.tree.tree_
        reached = governor.tree.apply(table.features)

        def node(i: int) -> dict[str, Any]:
            if t.children_left[i] == -1:
                return leaf(np.flatnonzero(reached == i), np.asarray(t.value[i])[:, 0])
            return {"feature": table.feature_names[int(t.feature[i])], "threshold": float(t.threshold[i]),
                    "left": node(int(t.children_left[i])), "right": node(int(t.children_right[i]))}

        tree = node(0)
    return {"format": FORMAT, "family": FAMILY, "objective": objective, **meta, "tree": tree,
            "configurations": [[s.gpu_mhz, s.cpu_mhz, s.emc_mhz] for s in governor.settings]}


@dataclasses.dataclass(frozen=True)
class ConfigurationResult:
    """What training a governor of configurations found: the version to register, and its held-out figures.

    Attributes:
        governor: what is registered: the tree chosen on every training workload, or the fixed configuration where the
            tree did no better held out (`floored`).
        searched: the tree chosen on every training workload (what the nested CV scored as "search").
        fixed: the fixed configuration fitted on every training workload (the floor).
        governor_regret: each training workload's held-out regret under the nested CV's tree (fitted without its group).
        fixed_regret: each training workload's held-out regret under the fixed configuration fitted without its group.
        workloads: the training workloads (the regrets' order).
        n_groups: the groups held out (tasks).
        floored: the fixed configuration replaced the tree.
    """

    governor: ConfigurationTree
    searched: ConfigurationTree
    fixed: ConfigurationTree
    governor_regret: np.ndarray
    fixed_regret: np.ndarray
    workloads: tuple[str, ...]
    n_groups: int
    floored: bool

    @property
    def version_regret(self) -> np.ndarray:
        """The registered version's held-out regret per workload (the fixed configuration's where floored)."""
        return self.fixed_regret if self.floored else self.governor_regret

    @property
    def features_matter(self) -> bool:
        """The tree beats the fixed configuration held out by more than the CV's noise (the paired interval's top < 0)."""
        return _paired(self.governor_regret, self.fixed_regret)[2] < 0

    def metrics(self, policy: dict[str, Any]) -> dict[str, float]:
        """What the training run logs and the registry's gates read (fractions), named as the GPU-only search's
        (`search.SearchResult.metrics`): `tree_outer_*` the version's held-out figures, `search_outer_*` the tree's,
        `ffg_outer_*` the fixed configuration's, `tree_minus_ffg_outer_regret` with its paired 95 % interval."""
        from dvfs_mlops.model.governor import policy_tree

        m = {"n_workloads": float(len(self.workloads)), "n_outer_groups": float(self.n_groups),
             "features_matter": float(self.features_matter), "floored": float(self.floored),
             "tree_depth": float(policy_tree.tree_depth(policy["tree"])),
             "n_features_used": float(len(policy_tree.features_used(policy["tree"]))),
             "n_configurations": float(len(self.governor.settings))}
        for name, regrets in (("tree", self.version_regret), ("search", self.governor_regret), ("ffg", self.fixed_regret)):
            lo, hi = ci(regrets)
            m.update({f"{name}_outer_regret": float(np.mean(regrets)), f"{name}_outer_regret_ci_low": lo,
                      f"{name}_outer_regret_ci_high": hi, f"{name}_outer_regret_max": float(np.max(regrets))})
        mean, lo, hi = _paired(self.version_regret, self.fixed_regret)
        m.update({"tree_minus_ffg_outer_regret": mean, "tree_minus_ffg_outer_regret_ci_low": lo, "tree_minus_ffg_outer_regret_ci_high": hi})
        return m

    def description(self, truth: str, metric: str) -> str:
        """The registered version's description: what it is, what won and why (the held-out figures)."""
        g = self.governor
        what = (f"A governor of configurations: a regression tree of depth {g.depth} (min leaf {g.min_leaf}) from the workload's "
                f"features to its normalised cost ({metric}) at each of {len(g.settings)} configurations (GPU, CPU, EMC clock); "
                "each leaf holds its workloads' mean curve, and the objective picks from it at decision time."
                if g.tree is not None else
                f"One fixed configuration for every workload: {g.settings[g.fixed].label()} (the least mean normalised "
                f"{metric} over the training workloads).")
        inner = ("inner folds hold one of the other tasks out" if inner_split(self.n_groups) == "task" else
                 "with two tasks, the inner folds hold one workload of the other task out")
        held = (f"held out (nested CV, one task out, {self.n_groups} folds, {inner}; regret against the joint oracle on {truth}): the tree "
                f"{_pct(float(np.mean(self.governor_regret)))}, the fixed configuration {_pct(float(np.mean(self.fixed_regret)))}")
        searched = (f"depths {', '.join(map(str, DEPTHS))} x min leaf {', '.join(map(str, MIN_LEAVES))}, every one scored by "
                    f"leaving each task out (an exhaustive grid of {len(DEPTHS) * len(MIN_LEAVES)}: smaller than any Optuna study would need)")
        why = (f"Why this one: the tree ({searched}) did no better {held}, so the fixed configuration is registered (a tie goes "
               "to it)."
               if self.floored else f"Why this one: chosen among {searched}; {held}.")
        mean, lo, hi = _paired(self.version_regret, self.fixed_regret)
        verdict = ("features matter here: the tree beats one fixed configuration by more than the CV's noise" if self.features_matter
                   else "one fixed configuration does as well within the CV's noise")
        return "\n\n".join([what, why, (f"This version minus the fixed configuration, paired over the held-out workloads: "
                                       f"{100 * mean:+.3f} points [{100 * lo:+.3f}, {100 * hi:+.3f}]; {verdict}.")])


def _pct(x: float) -> str:
    return f"{100 * x:.3f} %"


def ci(values: np.ndarray) -> tuple[float, float]:
    """The bootstrap 95 % interval of the mean over workloads (`search.bootstrap_ci`)."""
    from dvfs_mlops.model.governor.search import bootstrap_ci

    return bootstrap_ci(list(map(float, values)))


def _paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(mean, 95 % low, 95 % high) of a - b, a paired bootstrap over workloads."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    lo, hi = ci(d)
    return float(d.mean()), lo, hi


def train_configurations(table: ConfigurationTable) -> ConfigurationResult:
    """Train a governor of configurations for registration: a tree (a forest has no policy.json form) chosen on every
    training workload, judged by nested CV (`nested_regret`) against the fixed configuration, which replaces it unless
    the tree did better held out (a tie, as where no inner fold had two workloads to choose on, registers the fixed
    configuration: the version registered is always the one the held-out figures score).

    Raises:
        DvfsError: fewer than two groups (nothing to hold out).
    """
    if len(set(table.groups)) < 2:
        raise DvfsError(f"a governor of configurations is judged by holding tasks out, and the training workloads have "
                        f"{len(set(table.groups))} task(s) ({', '.join(sorted(set(table.groups)))}); sweep at least two training tasks")
    governor_regret, fixed_regret = nested_regret(table, kinds=("tree",))
    searched = fit_configuration_tree(table, kinds=("tree",))
    fixed = fixed_configuration(table)
    floored = bool(np.mean(governor_regret) >= np.mean(fixed_regret) - 1e-12)  # a tie goes to the fixed configuration
    return ConfigurationResult(fixed if floored else searched, searched, fixed, governor_regret, fixed_regret, table.workloads,
                               len(set(table.groups)), floored)
