"""Governor helpers only the tests use: leave-one-workload-out cross-validation.

The product cross-validates through `dvfs_mlops.model.governor.search.cross_validate` with a split it chooses
(workload, task or model); the tests pin its arithmetic on the simplest split, one workload held out at a time.
"""
from __future__ import annotations

from collections.abc import Sequence

from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import Objective
from dvfs_mlops.model.governor.search import CVScore, Fitter, cross_validate


def loocv(curves: Sequence[WorkloadCurve], objective: Objective, fit: Fitter) -> CVScore:
    """Leave-one-workload-out: fit on the others, choose for the held-out one."""
    return cross_validate(curves, objective, fit, "workload")
