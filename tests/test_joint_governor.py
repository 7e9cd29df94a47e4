"""A governor of configurations in process (no MLflow): a configuration table from the twin's expected joint energy, its
policy.json decided by the stdlib `policy_tree` exactly as the fitted tree picks, the objective applied at decision
time, a GPU-only policy's output unchanged (CPU and EMC null), the choice snapped to a device's tables or left alone
where the device cannot set a clock, evaluate's side by side, and bad input (a joint sweep with holes) in one line."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from dvfs_mlops.clocks import MAXN, Setting
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import legacy_board
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.profiles import builtin_profile
from dvfs_mlops.mlops.dataset import SweepPoints
from dvfs_mlops.mlops.evaluate import evaluate_joint
from dvfs_mlops.mlops.governor import Governor, GovernorRef, PolicyModel
from dvfs_mlops.mlops.joint_dataset import JointDataset, joint_dataset_from_points
from dvfs_mlops.mlops.launch import applicable
from dvfs_mlops.model.governor import policy_tree
from dvfs_mlops.model.governor.configurations import ConfigurationTable, to_policy, train_configurations
from dvfs_mlops.model.governor.objectives import parse_objective
from dvfs_mlops.model.workload import NUMERIC_FEATURES, WorkloadFeatures
from testkit.governor import SEQUENCES, SIZES, synthetic_trace

GPU, CPU, EMC = (306.0, 612.0, 918.0, 1300.5), (729.6, 1420.8, 2201.6), (2133.0, 3199.0)
SETTINGS = tuple(itertools.starmap(Setting, itertools.product(GPU, CPU, EMC)))


@pytest.fixture(scope="module")
def joint() -> JointDataset:
    """Synthetic transformer-like workloads (8 sizes x 3 sequence lengths, a task each) at 24 configurations of the
    sim-orin twin, costed by its noise-free joint energy (SIMULATED); every third size is held out (eval)."""
    dev = SimDevice(params=builtin_profile("sim-orin"))
    names, feats, splits, groups, costs, times, maxn_t, maxn_e = [], [], [], [], [], [], [], []
    for k, ((layers, hidden), (seq, task)) in enumerate(itertools.product(SIZES[:8], SEQUENCES)):
        trace = synthetic_trace(layers, hidden, seq)
        expected = [dev.expected(trace, s) for s in SETTINGS]
        top = dev.expected(trace, MAXN)
        names.append(f"m{layers}x{hidden}/{task}")
        params = layers * 12 * hidden * hidden
        feats.append(WorkloadFeatures("encoder", layers, hidden, params, float(seq), 100.0 * top.gpu_util, params, "fp32"))
        splits.append("eval" if (k // len(SEQUENCES)) % 3 == 2 else "train")
        groups.append(task)
        costs.append([e.energy_joint_expected_j for e in expected])
        times.append([e.time_expected_s for e in expected])
        maxn_t.append(top.time_expected_s)
        maxn_e.append(top.energy_joint_expected_j)
    matrix = np.array([[f.numeric_row()[c] for c in NUMERIC_FEATURES] for f in feats])
    table = ConfigurationTable(SETTINGS, tuple(names), matrix, NUMERIC_FEATURES, np.array(costs), tuple(groups))
    return JointDataset(table, np.array(times), np.array(maxn_t), np.array(maxn_e), tuple(feats), tuple(splits),
                        "energy_joint_expected_j", "VDD_GPU_SOC,VDD_CPU_CV,VDDQ_VDD2_1V8AO", ("gpu", "cpu", "emc"), "sweep-test",
                        "sim-orin", True)


@pytest.fixture(scope="module")
def trained(joint: JointDataset) -> tuple:
    train = joint.split("train")
    result = train_configurations(train.table)
    policy = json.loads(json.dumps(to_policy(result.governor, train.table, train.slowdown, knobs="gpu,cpu,emc")))  # stdlib JSON
    return train, result, policy


def test_the_policy_of_configurations_decides_as_the_fitted_tree_and_says_its_configuration(trained):
    train, result, policy = trained
    assert policy["family"] == "configurations" and len(policy["configurations"]) == len(SETTINGS)
    picks = result.governor.pick(train.table.features)
    rows = [f.as_row() for f in train.features]
    for row, pick in zip(rows, picks):
        (gpu, cpu, emc), path = policy_tree.decide_configuration(policy, row)
        assert Setting(gpu, cpu, emc) == pick, (row, path)
    out = policy_tree.decide_rows(policy, rows[:2])
    assert out["cpu_mhz"] == [picks[0].cpu_mhz, picks[1].cpu_mhz] and out["emc_mhz"] == [picks[0].emc_mhz, picks[1].emc_mhz]
    assert out["decision_path"][0].endswith(f"-> {picks[0].label()}")
    metrics = result.metrics(policy)
    assert metrics["tree_outer_regret"] <= metrics["ffg_outer_regret"] + 1e-12  # the fixed configuration is the floor
    assert {"tree_outer_regret_ci_high", "tree_minus_ffg_outer_regret_ci_low", "n_features_used", "features_matter"} <= set(metrics)


def test_max_slowdown_is_applied_at_decision_time_from_the_leaves_times(trained):
    train, _, policy = trained
    energy = [policy_tree.decide_configuration(policy, f.as_row())[0] for f in train.features]
    bounded = [policy_tree.decide_configuration(policy, f.as_row(), "max-slowdown:1.05")[0] for f in train.features]
    column = {(s.gpu_mhz, s.cpu_mhz, s.emc_mhz): j for j, s in enumerate(SETTINGS)}
    slow = train.slowdown
    for i, c in enumerate(bounded):
        # the leaf's time_hi is the largest slowdown of its training workloads: each of them meets the bound
        assert slow[i, column[c]] <= 1.05 + 1e-6 or slow[i, column[c]] == slow[i].min(), (train.table.workloads[i], c)
    assert bounded != energy  # the bound moves at least one workload to faster clocks


def test_a_gpu_only_policy_decides_as_before_with_null_cpu_and_memory_clocks():
    curve = {"format": policy_tree.FORMAT, "family": "curve", "objective": "energy", "clocks_mhz": [510.0, 816.0, 1300.5],
             "tree": {"feature": "num_layers", "threshold": 7,
                      "left": {"energy": [1.0, 1.05, 1.2], "time": [1.8, 1.3, 1.0], "time_hi": [1.9, 1.35, 1.0], "samples": 3},
                      "right": {"energy": [1.1, 1.0, 1.02], "time": [1.5, 1.08, 1.0], "time_hi": [1.6, 1.12, 1.0], "samples": 2}}}
    rows = [{"num_layers": 2}, {"num_layers": 12}]
    out = policy_tree.decide_rows(curve, rows, table=[510.0, 800.0, 1300.5])
    assert out["freq_mhz"] == [510.0, 800.0] and out["cpu_mhz"] == [None, None] and out["emc_mhz"] == [None, None]
    _f, path = policy_tree.decide(curve, rows[1])
    assert out["decision_path"][1] == policy_tree.explain(path, 800.0)
    assert policy_tree.decide(curve, rows[0], "max-slowdown:1.4")[0] == 816.0  # as tests/test_governor_cv.py pins it
    choice = Governor(GovernorRef("policy.json"), PolicyModel(curve)).decide(rows[1], [510.0, 816.0, 1300.5])
    assert (choice.freq_mhz, choice.cpu_mhz, choice.emc_mhz) == (816.0, None, None)


def test_a_choice_snaps_to_the_devices_tables_and_a_clock_the_device_cannot_set_stays_in_one_line(trained):
    train, _, policy = trained
    governor = Governor(GovernorRef("policy.json"), PolicyModel(policy))
    features = train.features[0]
    (gpu, cpu, emc), _ = policy_tree.decide_configuration(policy, features.as_row())
    cpu_table, emc_table = [cpu + 10.0, 3000.0], [emc - 1.0, 4000.0]  # another board's tables: the nearest clock of each
    choice = governor.decide(features, [gpu + 1.0, 2000.0], cpu_frequencies=cpu_table, emc_frequencies=emc_table)
    assert (choice.freq_mhz, choice.cpu_mhz, choice.emc_mhz) == (gpu + 1.0, cpu + 10.0, emc - 1.0)
    said: list[str] = []
    kept = applicable(choice, {"cpu_mhz": [], "emc_mhz": emc_table}, "nvml", False, "dvfs-governor v3", said.append)
    assert (kept.freq_mhz, kept.cpu_mhz, kept.emc_mhz) == (choice.freq_mhz, None, choice.emc_mhz)
    assert said == [(f"governor dvfs-governor v3 chose the CPU clock {cpu + 10.0:g} MHz with {gpu + 1.0:g} MHz; the nvml backend "
                    "cannot set it, so it stays as found and the GPU clock is applied")]
    observed = applicable(choice, {"cpu_mhz": cpu_table, "emc_mhz": emc_table}, "sim", True, "v3", said.append)
    assert (observed.cpu_mhz, observed.emc_mhz) == (None, None) and "--observe pins nothing" in said[-1]


@pytest.mark.parametrize("objective", ["energy", "max-slowdown:1.1"])
def test_evaluate_puts_gpu_only_and_joint_policies_side_by_side_on_one_energy(joint, objective):
    report = evaluate_joint(joint, ["gpu-oracle", "ffg", "fixed-configuration", "oracle", "maxn"], parse_objective(objective))
    out = {o["policy"]: o for o in report.to_json()}
    assert list(out) == ["gpu-oracle", "ffg", "fixed-configuration", "joint oracle", "maxn"]
    assert all(o["energy_metric"] == "energy_joint_expected_j" and o["simulated"] for o in out.values())
    assert out["gpu-oracle"]["knobs"] == "gpu" and out["fixed-configuration"]["knobs"] == "gpu,cpu,emc"
    assert out["joint oracle"]["regret_expected"] == 0.0
    assert out["gpu-oracle"]["regret_expected"] >= 0.0 and out["ffg"]["regret_expected"] >= out["gpu-oracle"]["regret_expected"]
    if objective == "energy":  # the joint oracle saves at least what the GPU-only one does: its configurations include them
        assert out["joint oracle"]["saving"] >= out["gpu-oracle"]["saving"] > 0
        assert out["gpu-oracle"]["regret_expected"] > 0  # ... and here strictly more: the CPU clock matters on the twin


def _frame(holes: bool) -> pd.DataFrame:
    """Point runs of a joint sweep as `mlflow.search_runs` gives them: 2 workloads, maxn and 2 configurations each."""
    rows = []
    for model in ("bert-tiny", "bert-mini"):
        for freq, cpu in (("maxn", None), ("612", "729.6"), ("612", "2201.6")):
            if holes and model == "bert-mini" and cpu == "2201.6":
                continue
            rows.append({"params.model": model, "params.task": "sst2", "params.split": "train", "params.freq_mhz": freq,
                         "params.cpu_freq_mhz": cpu, "params.model_type": "encoder", "params.num_layers": "2",
                         "params.hidden_size": "128", "params.num_params": "4386178", "params.avg_seq_len": "14.0",
                         "metrics.energy_joint_expected_j": 10.0 + (cpu is None), "metrics.time_expected_s": 1.0,
                         "metrics.gpu_util_pct": 50.0, "tags.dvfs.workload": f"{model}/sst2", "tags.dvfs.simulated": "true"})
    return pd.DataFrame(rows)


def test_a_joint_sweep_is_read_as_a_table_and_one_with_holes_or_of_the_gpu_alone_is_refused_in_one_line():
    board = legacy_board("sim-orin", [612.0])
    ok = joint_dataset_from_points(SweepPoints(_frame(False), "sweep-a", "sim-orin", True, board))
    assert ok.table.settings == (Setting(612.0, 729.6), Setting(612.0, 2201.6)) and ok.tuned == ("gpu", "cpu")
    assert ok.metric == "energy_joint_expected_j" and ok.table.groups == ("sst2", "sst2")
    with pytest.raises(DvfsError) as e:
        joint_dataset_from_points(SweepPoints(_frame(True), "sweep-b", "sim-orin", True, board))
    assert "\n" not in str(e.value) and "bert-mini/sst2 (1 of 2 configurations missing)" in str(e.value)
    blind = _frame(False).drop(columns=["metrics.gpu_util_pct"])  # a replayed grid without the utilisation column
    with pytest.raises(DvfsError, match="2 workload\\(s\\) without the GPU utilisation at maxn the governor decides on"):
        joint_dataset_from_points(SweepPoints(blind, "sweep-d", "sim-orin", True, board))
    alone = _frame(False).drop(columns=["params.cpu_freq_mhz"])
    with pytest.raises(DvfsError, match="tunes the GPU clock alone; a governor of configurations learns from a sweep of configurations"):
        joint_dataset_from_points(SweepPoints(alone, "sweep-c", "sim-orin", True, board))
    with pytest.raises(DvfsError, match="1 task\\(s\\) \\(sst2\\); sweep at least two training tasks"):
        train_configurations(ok.table)


def test_the_production_comparison_gate_is_not_applicable_between_gpu_only_and_joint_versions():
    from types import SimpleNamespace

    from dvfs_mlops.mlops.registry import _gate

    gate = {"name": "regret-no-worse-than-production", "metric": "tree_outer_regret", "compare_to": "production", "tolerance": 0.0}
    joint_v = SimpleNamespace(version="4", tags={"knobs": "gpu,cpu,emc", "family": "configurations"})
    gpu_v = SimpleNamespace(version="3", tags={"family": "curve"})
    other = _gate(gate, gate["name"], "tree_outer_regret", 0.001, {}, joint_v, gpu_v, {"tree_outer_regret": 0.0005}, "jetson-agx-orin-64gb")
    assert other.passed is None and "this version decides gpu,cpu,emc, jetson-agx-orin-64gb's production v3 gpu" in other.detail
    same = _gate(gate, gate["name"], "tree_outer_regret", 0.001, {}, gpu_v, SimpleNamespace(version="2", tags={}),
                 {"tree_outer_regret": 0.0005}, "jetson-agx-orin-64gb")
    assert same.passed is False  # two GPU-only versions are compared as before


def test_two_training_tasks_register_the_version_the_held_out_figures_score(joint):
    """With two tasks every outer fold leaves one task to choose on: the inner folds hold its workloads out one by one,
    a tie with the fixed configuration registers the fixed configuration, and the figures logged are the registered
    version's."""
    from dvfs_mlops.model.governor.configurations import fixed_configuration

    train = joint.split("train").table
    two = sorted(set(train.groups))[:2]
    table = train.subset([i for i, g in enumerate(train.groups) if g in two])
    result = train_configurations(table)
    assert result.floored == bool(result.governor_regret.mean() >= result.fixed_regret.mean() - 1e-12)
    assert (result.governor.tree is None) == result.floored
    assert "the inner folds hold one workload of the other task out" in result.description("SIMULATED", "energy_joint_expected_j")
    # one workload per task: nothing to choose on inside a fold, the nested CV scores the fixed configuration: a tie
    single = table.subset([table.groups.index(g) for g in two])
    tie = train_configurations(single)
    assert np.array_equal(tie.governor_regret, tie.fixed_regret) and tie.floored and tie.governor.kind == "fixed"
    assert tie.governor.fixed == fixed_configuration(single).fixed
    metrics = tie.metrics(to_policy(tie.governor, single, np.ones_like(single.cost)))
    assert metrics["tree_outer_regret"] == pytest.approx(float(tie.fixed_regret.mean())) and metrics["floored"] == 1.0


def _capped(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with one more maxn of bert-tiny, capped at the start, whose energy would be the least."""
    extra = frame[(frame["params.model"] == "bert-tiny") & (frame["params.freq_mhz"] == "maxn")].copy()
    extra["metrics.energy_joint_expected_j"] = 1.0
    extra["tags.dvfs.cap_at_start"] = "612"
    return pd.concat([frame, extra], ignore_index=True)


def test_the_joint_maxn_reference_leaves_capped_runs_out_and_never_mixes_metrics():
    board = legacy_board("sim-orin", [612.0])
    ok = joint_dataset_from_points(SweepPoints(_capped(_frame(False)), "sweep-e", "sim-orin", True, board))
    assert list(ok.maxn_cost) == [11.0, 11.0]  # the capped maxn (1.0) is not the reference
    no_maxn_metric = _frame(False)
    no_maxn_metric.loc[no_maxn_metric["params.freq_mhz"] == "maxn", "metrics.energy_joint_expected_j"] = np.nan
    no_maxn_metric["metrics.energy_j"] = 5.0  # logged everywhere: chosen for every point, maxn included, never mixed
    no_maxn_metric["metrics.time_s"] = 2.0
    mixed = joint_dataset_from_points(SweepPoints(no_maxn_metric, "sweep-f", "sim-orin", True, board))
    assert mixed.metric == "energy_j" and list(mixed.maxn_cost) == [5.0, 5.0] and list(mixed.maxn_time_s) == [2.0, 2.0]
    with pytest.raises(DvfsError, match=r"log none of energy_joint_expected_j, energy_joint_j, energy_j .*bert-mini/sst2@maxn"):
        joint_dataset_from_points(SweepPoints(no_maxn_metric.drop(columns=["metrics.energy_j"]), "sweep-g", "sim-orin", True, board))
    no_time = _frame(False)
    no_time.loc[no_time["params.freq_mhz"] == "maxn", "metrics.time_expected_s"] = np.nan  # the expected energy's time
    with pytest.raises(DvfsError, match="log none of time_expected_s") as e:
        joint_dataset_from_points(SweepPoints(no_time, "sweep-h", "sim-orin", True, board))
    assert "\n" not in str(e.value)


def test_a_table_that_is_not_a_full_grid_is_refused_in_one_line():
    board = legacy_board("sim-orin", [612.0, 1300.5])
    frame = _frame(False)
    faster = frame[frame["params.cpu_freq_mhz"] == "729.6"].assign(**{"params.freq_mhz": "1300.5"})  # no 1300.5 x 2201.6
    with pytest.raises(DvfsError, match=r"not a full grid \(1 of the GPU x CPU x EMC product missing: GPU 1300.5 / CPU 2201.6 MHz\)"):
        joint_dataset_from_points(SweepPoints(pd.concat([frame, faster], ignore_index=True), "sweep-i", "sim-orin", True, board))


def test_a_replay_dry_run_plays_the_whole_configuration_a_governor_of_configurations_decides(trained, tmp_path, monkeypatch):
    """`finetune --device replay --dry-run` on a grid with CPU and EMC columns: the governor's CPU and EMC clocks are the
    file's, kept, and the REPLAYED saving is the grid's at that configuration (not at the GPU clock's top slice)."""
    from dvfs_mlops.app.devices import DeviceChoice, open_chosen
    from dvfs_mlops.app.replay_decide import replay_dry_run
    from dvfs_mlops.mlops import governor as governor_module
    from dvfs_mlops.mlops.launch import LaunchOptions
    from dvfs_mlops.mlops.sweep.replayed import features_of_grid

    train, _, policy = trained
    feats = train.features[0]
    rows = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j,model_type,num_layers,hidden_size,num_params,avg_seq_len,gpu_util_pct"]
    for k, s in enumerate(SETTINGS):  # every configuration's energy distinct, so the look-up says which one was played
        rows.append(f"w,{s.gpu_mhz:g},{s.cpu_mhz:g},{s.emc_mhz:g},{1.0 + k / 100},{10.0 + k},{feats.model_type},{feats.num_layers},"
                    f"{feats.hidden_size},{feats.num_params},{feats.avg_seq_len:g},{feats.gpu_util_pct:g}")
    grid = tmp_path / "joint-grid.csv"
    grid.write_text("\n".join(rows) + "\n")
    joint_governor = Governor(GovernorRef("policy.json"), PolicyModel(policy))
    monkeypatch.setattr(governor_module, "_for_board", lambda *_a, **_k: joint_governor)  # the registry's answer, in process
    said: list[str] = []
    out = replay_dry_run("w", False, DeviceChoice(backend="replay", trace=str(grid)), LaunchOptions(dry_run=True, refine=0),
                         said.append)
    row = features_of_grid(open_chosen(DeviceChoice(backend="replay", trace=str(grid))).grid, "w").as_row()  # type: ignore[attr-defined]
    (gpu, cpu, emc), _ = policy_tree.decide_configuration(policy, row)
    decision, replayed = out["decision"], out["replayed"]
    assert (decision["freq_mhz"], decision["cpu_mhz"], decision["emc_mhz"]) == (gpu, cpu, emc)
    assert (replayed["gpu_mhz"], replayed["cpu_mhz"], replayed["emc_mhz"]) == (gpu, cpu, emc)
    played = SETTINGS.index(Setting(gpu, cpu, emc))
    assert replayed["energy_j"] == 10.0 + played and replayed["top_energy_j"] == 10.0 + len(SETTINGS) - 1
    assert not any("cannot set" in line for line in said), said



def test_calibrate_refuses_a_governor_of_configurations_in_one_line(trained):
    from dvfs_mlops.hw.board import legacy_board
    from dvfs_mlops.model.governor.transfer import calibrate_policy

    _, _, policy = trained
    with pytest.raises(DvfsError, match="calibrate moves a GPU-only governor") as e:
        calibrate_policy(policy, legacy_board("sim-orin-nano-8gb", [306.0, 612.0]), [])
    assert "\n" not in str(e.value)


def test_joint_regret_is_on_the_measured_energy_and_expected_on_the_expected_and_the_table_says_which(joint):
    """On the twin a joint sweep logs both energies: `regret` is against the oracle of the measured one (energy_joint_j),
    `regret_expected` against the expected one's; the text names the energy metric and each policy's knobs."""
    import dataclasses

    from dvfs_mlops.mlops.evaluate import format_table

    rng = np.random.default_rng(0)
    noisy = joint.table.cost * rng.uniform(0.85, 1.15, joint.table.cost.shape)  # a measured draw around the expected
    measured = dataclasses.replace(joint, table=dataclasses.replace(joint.table, cost=noisy), metric="energy_joint_j")
    both = dataclasses.replace(joint, measured=measured)
    report = evaluate_joint(both, ["fixed-configuration", "oracle", "maxn"], parse_objective("energy"))
    out = {o["policy"]: o for o in report.to_json()}
    assert out["joint oracle"]["regret_expected"] == 0.0 and out["joint oracle"]["regret"] > 0  # the expected oracle, measured
    rows = [r for r in report.rows if r.policy == "joint oracle"]
    data = both.split("eval")
    for i, r in enumerate(rows):
        j = [s.label() for s in data.table.settings].index(r.freq)
        assert r.regret_vs_oracle == pytest.approx(data.measured.table.cost[i, j] / data.measured.table.cost[i].min() - 1)
    text = format_table(report)
    assert "energy metric: energy_joint_expected_j" in text and "against the measured oracle on energy_joint_j" in text
    assert text.splitlines()[2].endswith("knobs") and any(line.endswith("gpu,cpu,emc") for line in text.splitlines())
    alone = {o["policy"]: o for o in evaluate_joint(joint, ["oracle"], parse_objective("energy")).to_json()}
    assert alone["joint oracle"]["regret"] is None  # no measured energy: no measured regret, said so
    assert "not measured" in format_table(evaluate_joint(joint, ["oracle"], parse_objective("energy")))


def test_the_decision_path_names_the_clocks_pinned_after_snapping_and_dropping(trained):
    train, _, policy = trained
    governor = Governor(GovernorRef("policy.json"), PolicyModel(policy))
    features = train.features[0]
    (gpu, cpu, emc), _ = policy_tree.decide_configuration(policy, features.as_row())
    choice = governor.decide(features, [gpu + 1.0], cpu_frequencies=[cpu + 10.0], emc_frequencies=[emc - 1.0])
    assert choice.path.endswith(f"-> {Setting(gpu + 1.0, cpu + 10.0, emc - 1.0).label()}"), choice.path
    kept = applicable(choice, {"cpu_mhz": [], "emc_mhz": [emc - 1.0]}, "nvml", False, "v3", lambda _m: None)
    assert kept.path.endswith(f"-> GPU {gpu + 1.0:g} / EMC {emc - 1.0:g} MHz"), kept.path
    assert kept.path.rpartition(" -> ")[0] == choice.path.rpartition(" -> ")[0]  # the splits unchanged
    none = applicable(choice, {"cpu_mhz": [], "emc_mhz": []}, "nvml", False, "v3", lambda _m: None)
    assert none.path.endswith(f"-> {gpu + 1.0:g} MHz")


def test_ties_go_to_the_faster_configuration_in_the_tree_its_policy_and_the_fixed_configuration(joint):
    """Every configuration at the lowest CPU clock costs exactly what the next CPU clock costs: the fitted tree, the
    fixed configuration and the shipped policy all pick the faster one, and the policy decides as the tree on every
    workload (held-out ones included)."""
    import dataclasses

    from dvfs_mlops.model.governor.configurations import fixed_configuration

    cost = joint.table.cost.copy()
    for j, s in enumerate(SETTINGS):
        if s.cpu_mhz == CPU[0]:
            cost[:, j] = cost[:, SETTINGS.index(Setting(s.gpu_mhz, CPU[1], s.emc_mhz))]
    tied = dataclasses.replace(joint, table=dataclasses.replace(joint.table, cost=cost))
    train = tied.split("train")
    result = train_configurations(train.table)
    for governor in (result.searched, fixed_configuration(train.table)):
        policy = json.loads(json.dumps(to_policy(governor, train.table, train.slowdown)))
        picks = governor.pick(tied.table.features)
        assert all(p.cpu_mhz != CPU[0] for p in picks)
        for f, pick in zip(tied.features, picks):
            assert Setting(*policy_tree.decide_configuration(policy, f.as_row())[0]) == pick


def test_a_gpu_only_governor_is_judged_beside_joint_ones_with_the_cpu_and_memory_clocks_at_their_tops(joint, monkeypatch):
    """A GPU-only curve governor (a models:/ version, here its policy in process) on a joint sweep: each workload's row
    is its GPU clock with the CPU and EMC clocks at their tops, the configuration a GPU-only governor runs."""
    from dvfs_mlops.mlops import governor as governor_module

    curve = {"format": policy_tree.FORMAT, "family": "curve", "objective": "energy", "clocks_mhz": list(GPU),
             "tree": {"feature": "num_layers", "threshold": 3,
                      "left": {"energy": [1.3, 1.0, 1.1, 1.2], "time": [2.5, 1.5, 1.2, 1.0], "time_hi": [2.6, 1.6, 1.2, 1.0], "samples": 2},
                      "right": {"energy": [1.4, 1.2, 1.0, 1.1], "time": [2.5, 1.5, 1.2, 1.0], "time_hi": [2.6, 1.6, 1.2, 1.0], "samples": 2}}}
    gpu_only = Governor(GovernorRef("models:/dvfs-governor/2"), PolicyModel(curve))
    monkeypatch.setattr(governor_module, "load_governor", lambda *_a, **_k: gpu_only)  # the registry's answer, in process
    report = evaluate_joint(joint, ["models:/dvfs-governor/2", "oracle"], parse_objective("energy"))
    assert report.knobs["models:/dvfs-governor/2"] == "gpu"
    data = joint.split("eval")
    rows = [r for r in report.rows if r.policy == "models:/dvfs-governor/2"]
    assert len(rows) == len(data.table.workloads)
    for f, r in zip(data.features, rows):
        gpu = policy_tree.decide(curve, f.as_row())[0]
        assert r.freq == Setting(gpu, CPU[-1], EMC[-1]).label()


def test_evaluate_fits_the_fixed_configuration_that_training_registers(joint):
    from dvfs_mlops.model.governor.configurations import fixed_configuration

    train = joint.split("train").table
    registered = fixed_configuration(train)
    report = evaluate_joint(joint, ["fixed-configuration"], parse_objective("energy"))
    assert {r.freq for r in report.rows} == {registered.settings[registered.fixed].label()}
