"""The governor of configurations (model/governor/configurations.py): features -> a (GPU, CPU, EMC) configuration,
chosen by held-out groups, judged by nested cross-validation against each workload's optimum."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dvfs_mlops.clocks import Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.model.governor.configurations import (
    ConfigurationTable,
    fit_configuration_tree,
    fixed_configuration,
    nested_regret,
    regret,
)

SETTINGS = tuple(itertools.starmap(Setting, itertools.product((510.0, 1300.5), (729.6, 2201.6), (2133.0, 3199.0))))


def _table(n_per_group: int = 6, groups: tuple[str, ...] = ("a", "b", "c", "d")) -> ConfigurationTable:
    """Host-bound workloads (feature 1 high) want the high CPU clock, the others the low one; the GPU and EMC axes
    are the same for all: the best configuration depends on one feature only."""
    rng = np.random.default_rng(0)
    rows, feats, names, group_of = [], [], [], []
    for g in groups:
        for i in range(n_per_group):
            host = rng.uniform(0.0, 1.0)
            cost = []
            for s in SETTINGS:
                want_cpu = 2201.6 if host > 0.5 else 729.6
                cost.append(1.0 + 0.2 * (s.cpu_mhz != want_cpu) + 0.05 * (s.gpu_mhz != 510.0) + 0.03 * (s.emc_mhz != 3199.0)
                            + 0.01 * rng.uniform())
            rows.append(cost)
            feats.append([rng.uniform(), host])
            names.append(f"{g}{i}")
            group_of.append(g)
    return ConfigurationTable(SETTINGS, tuple(names), np.array(feats), ("noise", "host_share"), np.array(rows), tuple(group_of))


def test_the_governor_learns_which_workloads_want_which_cpu_clock_and_beats_one_fixed_configuration():
    table = _table()
    governor, fixed = nested_regret(table)
    assert governor.mean() < 0.01 and fixed.mean() > 0.05  # one configuration cannot serve both kinds of workload
    whole = fit_configuration_tree(table)
    assert whole.kind in ("tree", "forest")
    picks = whole.pick(table.features)
    for pick, host in zip(picks, table.features[:, 1]):
        assert pick.cpu_mhz == (2201.6 if host > 0.5 else 729.6) and pick.gpu_mhz == 510.0 and pick.emc_mhz == 3199.0
    assert regret(table, whole).max() < 0.02


def test_the_fixed_configuration_is_the_least_mean_normalised_cost():
    table = _table()
    fixed = fixed_configuration(table)
    assert fixed.kind == "fixed" and SETTINGS[fixed.fixed] == SETTINGS[int(table.normalised.mean(axis=0).argmin())]
    assert set(fixed.pick(table.features)) == {SETTINGS[fixed.fixed]}


def test_bad_tables_are_refused():
    table = _table()
    with pytest.raises(DvfsError, match="finite number > 0"):
        ConfigurationTable(SETTINGS, table.workloads, table.features, table.feature_names, -table.cost, table.groups)
    with pytest.raises(DvfsError, match="workloads x"):
        ConfigurationTable(SETTINGS[:-1], table.workloads, table.features, table.feature_names, table.cost, table.groups)
    with pytest.raises(DvfsError, match="at least two groups"):
        fit_configuration_tree(_table(groups=("a",)))
