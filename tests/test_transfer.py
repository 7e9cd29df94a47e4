"""Moving a curve governor to another board (model.governor.transfer) on the twin's expected curves of synthetic step
traces: no torch, no MLflow."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import board_of
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.profiles import builtin_profile
from dvfs_mlops.model.governor.curve_tree import CurveParams, fit_curve_policy
from dvfs_mlops.model.governor.dataset import WorkloadCurve
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.governor.policies import TreePolicy
from dvfs_mlops.model.governor.policy_tree import decide
from dvfs_mlops.model.governor.transfer import CalibrationPlan, calibrate_policy, plan_calibration, spread_clocks
from testkit.governor import twin_curves

ENERGY = parse_objective("energy")
def _curves(profile: str) -> list[WorkloadCurve]:
    """Every size at three sequence lengths on the profile's twin, noise-free (expected = measured)."""
    return twin_curves(profile)


def _governor(curves: list[WorkloadCurve]) -> dict:
    train = [c for c in curves if c.split == "train"]
    features = ("num_layers", "hidden_size", "num_params", "avg_seq_len")
    return fit_curve_policy(train, train[0].clocks, CurveParams(max_depth=2, min_samples_leaf=2, features=features))[0]


def _calibration(policy: dict, profile: str, curves: list[WorkloadCurve]) -> tuple[CalibrationPlan, list[WorkloadCurve]]:
    board = board_of(SimDevice(builtin_profile(profile)))
    train = [c for c in curves if c.split == "train"]
    plan = plan_calibration(policy, board, [(c.workload, c.features) for c in train])
    picked = [WorkloadCurve(c.workload, c.split, c.features, {f: c.energy_j[f] for f in plan.clocks_mhz},
                            {f: c.time_s[f] for f in plan.clocks_mhz}, c.maxn_energy_j, c.maxn_time_s)
              for c in train if c.workload in plan.workloads]
    return plan, picked


def _regret(policy: dict, curves: list[WorkloadCurve]) -> float:
    tree = TreePolicy(policy, "p")
    return statistics.mean(c.regret(tree.choose(c.features, c.clocks), ENERGY) for c in curves if c.split == "eval")


@pytest.fixture(scope="module")
def boards() -> dict[str, tuple[list[WorkloadCurve], dict]]:
    out = {}
    for profile in ("sim-orin-measured", "sim-orin-nano-8gb"):
        curves = _curves(profile)
        out[profile] = (curves, _governor(curves))
    return out


def test_plan_measures_few_workloads_at_spread_target_clocks(boards):
    curves, policy = boards["sim-orin-measured"]
    nano = board_of(SimDevice(builtin_profile("sim-orin-nano-8gb")))
    agx = board_of(SimDevice(builtin_profile("sim-orin-measured")))
    plan = plan_calibration(policy, agx, [(c.workload, c.features) for c in curves])
    assert len(plan.workloads) == 3 and len(set(plan.workloads)) == 3 and not plan.needs_maxn
    assert len(plan.clocks_mhz) == 4 and set(plan.clocks_mhz) <= set(agx.frequencies_mhz)
    assert plan.clocks_mhz[0] == min(agx.frequencies_mhz) and plan.clocks_mhz[-1] == max(agx.frequencies_mhz)
    assert plan.cost(200) == 4 * 3 * 200
    # the workloads come from different leaves of the source tree
    leaves = {tuple(decide(policy, next(c.features.as_row() for c in curves if c.workload == w))[1][:-1]) for w in plan.workloads}
    assert len(leaves) == 3
    by_name = plan_calibration(policy, nano, [c.workload for c in curves], max_workloads=2, max_clocks=3)
    assert len(by_name.workloads) == 2 and by_name.clocks_mhz == spread_clocks(nano.frequencies_mhz, 3)
    assert set(by_name.clocks_mhz) <= set(nano.frequencies_mhz)
    with pytest.raises(DvfsError, match=r"1\.\.3 workloads at 2\.\.4 clocks"):
        plan_calibration(policy, nano, ["a/b"], max_workloads=4)
    with pytest.raises(DvfsError, match="no candidate workloads"):
        plan_calibration(policy, nano, [])


def test_calibrating_onto_its_own_board_keeps_its_decisions(boards):
    curves, policy = boards["sim-orin-measured"]
    plan, cal = _calibration(policy, "sim-orin-measured", curves)
    moved = calibrate_policy(policy, board_of(SimDevice(builtin_profile("sim-orin-measured"))), cal)
    assert moved["clocks_mhz"] == policy["clocks_mhz"] and moved["board_family"] == "jetson-agx-orin-64gb"

    def splits(node: dict) -> list:
        return [] if "feature" not in node else [(node["feature"], node["threshold"]), *splits(node["left"]), *splits(node["right"])]

    assert splits(moved["tree"]) == splits(policy["tree"])  # the workload-level knowledge is kept
    held = [c for c in curves if c.split == "eval"]
    same = sum(decide(moved, c.features.as_row())[0] == decide(policy, c.features.as_row())[0] for c in held)
    assert same >= 0.75 * len(held)
    assert _regret(moved, curves) <= _regret(policy, curves) + 0.002
    assert moved["calibrated_from"]["clocks_mhz"] == policy["clocks_mhz"]
    assert set(moved["board_constants"]["workloads"]) == set(plan.workloads)


@pytest.mark.parametrize(("source", "target"), [("sim-orin-nano-8gb", "sim-orin-measured")])
def test_calibrated_governor_beats_the_snapped_source(boards, source, target):
    """A Nano governor snapped onto the AGX Orin's table pins its low clocks; calibrated from 3 x 4 points it lands
    near the target's own governor."""
    src_policy = boards[source][1]
    curves, own = boards[target]
    _, cal = _calibration(src_policy, target, curves)
    moved = calibrate_policy(src_policy, board_of(SimDevice(builtin_profile(target))), cal)
    assert moved["clocks_mhz"] == sorted(builtin_profile(target).frequencies_mhz)
    snapped, calibrated = _regret(src_policy, curves), _regret(moved, curves)
    assert calibrated < snapped
    assert calibrated - _regret(own, curves) < snapped - _regret(own, curves)


def test_a_classifier_tree_keeps_each_leaf_clock_in_its_place():
    policy = {"format": "dvfs-governor-policy/1", "tree": {"feature": "num_layers", "threshold": 6, "left": {"freq_mhz": 612.0},
                                                           "right": {"freq_mhz": 1300.5}}}
    nano = board_of(SimDevice(builtin_profile("sim-orin-nano-8gb")))
    moved = calibrate_policy(policy, nano, [])
    assert moved["tree"]["right"]["freq_mhz"] == 625.0 and moved["tree"]["left"]["freq_mhz"] == 306.0


def test_nothing_to_calibrate_from_is_one_error(boards):
    curves, policy = boards["sim-orin-measured"]
    one_clock = [WorkloadCurve(c.workload, c.split, c.features, {306.0: c.energy_j[306.0]}, {306.0: c.time_s[306.0]},
                               c.maxn_energy_j, c.maxn_time_s) for c in curves[:3]]
    with pytest.raises(DvfsError, match="two measured clocks"):
        calibrate_policy(policy, board_of(SimDevice(builtin_profile("sim-orin-nano-8gb"))), one_clock)


def test_the_published_tree_moves_to_the_nano_by_its_calibration_points(boards):
    """The published tree (a classifier of the AGX Orin 64 GB) on the Orin Nano: its leaves move to where the calibration
    workloads' own curve fits put the optimum, which beats the tree snapped to the Nano's table."""
    from dvfs_mlops.model.governor.policies import paper_tree
    from dvfs_mlops.model.governor.transfer import leaf_of

    source = paper_tree().policy
    curves, _ = boards["sim-orin-nano-8gb"]
    plan, cal = _calibration(source, "sim-orin-nano-8gb", curves)
    assert len(plan.workloads) == 3 and len(cal) == 3
    moved = calibrate_policy(source, board_of(SimDevice(builtin_profile("sim-orin-nano-8gb"))), cal)
    consts = moved["board_constants"]
    assert consts["f_max_mhz"] == 625.0 and consts["place_shift"] > 0, "a lower ceiling puts each optimum higher in the table"
    assert moved["calibrated_from"]["f_max_mhz"] == 1300.5, "the published tree's table is the AGX Orin 64 GB's, not its top leaf"
    assert moved["board_family"] == "jetson-orin-nano-8gb" and "clocks_mhz" not in moved
    table = builtin_profile("sim-orin-nano-8gb").frequencies_mhz
    for c in cal:  # a measured leaf takes its workloads' fitted optimum on the Nano
        path, leaf = leaf_of(moved, c.features.as_row())
        assert path in consts["measured_leaves"] and leaf["freq_mhz"] in table
    assert _regret(moved, curves) < _regret(source, curves)


def test_gpu_util_thresholds_move_onto_the_targets_scale(boards):
    """A tree that splits on GPU utilisation learnt its thresholds on the source: given the calibration workloads'
    features as the source measured them, the thresholds move by the board's utilisation shift (the Nano's slower GPU
    is busier) and the other splits stay; without them nothing moves."""
    import math

    from dvfs_mlops.model.governor.transfer import util_shift

    agx, nano = boards["sim-orin-measured"][0], boards["sim-orin-nano-8gb"][0]
    train = [c for c in agx if c.split == "train"]
    policy = fit_curve_policy(train, train[0].clocks, CurveParams(max_depth=2, min_samples_leaf=2,
                                                                   features=("gpu_util_pct", "num_layers", "avg_seq_len")))[0]
    assert "gpu_util_pct" in {n["feature"] for n in _splits(policy["tree"])}
    plan, cal = _calibration(policy, "sim-orin-nano-8gb", nano)
    measured_there = {c.workload: c.features for c in agx if c.workload in plan.workloads}
    board = board_of(SimDevice(builtin_profile("sim-orin-nano-8gb")))
    moved = calibrate_policy(policy, board, cal, measured_there)
    shift = moved["board_constants"]["util_shift"]
    assert shift == util_shift(cal, measured_there) and shift > 0, "the same workloads are busier on the Nano"
    for before, after in zip(_splits(policy["tree"]), _splits(moved["tree"])):
        assert before["feature"] == after["feature"]
        if before["feature"] == "gpu_util_pct":
            x = before["threshold"] / 100.0
            assert after["threshold"] == pytest.approx(100.0 / (1.0 + math.exp(-(math.log(x / (1 - x)) + shift))), abs=1e-5)
            assert after["threshold"] > before["threshold"]
        else:
            assert after["threshold"] == before["threshold"]
    kept = calibrate_policy(policy, board, cal)
    assert "util_shift" not in kept["board_constants"]
    assert [n["threshold"] for n in _splits(kept["tree"])] == [n["threshold"] for n in _splits(policy["tree"])]
    assert _regret(moved, nano) <= 0.005


def _splits(node: dict) -> list[dict]:
    return [] if "feature" not in node else [node, *_splits(node["left"]), *_splits(node["right"])]


def test_a_source_without_splits_is_split_by_the_calibration_points_utilisation(boards):
    """A one-curve source (a board whose ceiling binds picks one clock for everything) carries no workload knowledge:
    on the AGX Orin the calibration workloads' own fits split it by GPU utilisation (a busier workload at a higher
    clock); without a utilisation it stays one curve."""
    nano_curves, agx_curves = boards["sim-orin-nano-8gb"][0], boards["sim-orin-measured"][0]
    train = [c for c in nano_curves if c.split == "train"]
    one_leaf = fit_curve_policy(train, train[0].clocks, CurveParams(max_depth=0))[0]
    _, cal = _calibration(one_leaf, "sim-orin-measured", agx_curves)
    agx = board_of(SimDevice(builtin_profile("sim-orin-measured")))
    moved = calibrate_policy(one_leaf, agx, cal)
    nodes = _splits(moved["tree"])
    assert nodes and {n["feature"] for n in nodes} == {"gpu_util_pct"}
    fit = moved["board_constants"]["util_fit"]
    assert fit["time"][1] > 0, "a busier GPU has more of its time scaling with the clock"

    by_util = sorted(cal, key=lambda c: c.features.gpu_util_pct)
    least, most = (decide(moved, c.features.as_row())[0] for c in (by_util[0], by_util[-1]))
    assert least < most, "the busiest calibration workload runs at a higher clock than the least busy one"
    as_one = calibrate_policy(one_leaf, agx, [dataclasses.replace(c, features=c.features.with_gpu_util(None)) for c in cal])
    assert "feature" not in as_one["tree"] and "util_fit" not in as_one["board_constants"], "no utilisation: one curve"
    # within half a point of the oracle on this ladder, where the one curve moved as it is does a little better (0.38 %
    # against 0.46 %: three points pin the utilisation lines loosely); on the paper preset it does far better
    # (python -m benchmarks transfer, docs/benchmarks.md)
    assert _regret(moved, agx_curves) <= 0.005
