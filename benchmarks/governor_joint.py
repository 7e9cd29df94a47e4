"""A governor of configurations on the twin (SIMULATED): features -> one (GPU, CPU, EMC) configuration per workload,
judged against the twin's noise-free joint oracle.

Every model preset x the chosen tasks (batch 16, each task's mean length) is traced once; the twin's expected joint
energy (`SimDevice.expected`: the rails the GPU, CPU and memory clocks feed, AGX Orin VDD_GPU_SOC + VDD_CPU_CV +
VDDQ_VDD2_1V8AO) is computed at every configuration of the profile's tables. The governor
(`dvfs_mlops.model.governor.configurations`: a multi-output regression tree over normalised cost curves, depth and leaf
size chosen by inner cross-validation) is judged by nested cross-validation, one task held out at a time. Reported:

- held-out regret (mean, max) against the joint oracle, of the governor (trees or forests; and trees only, the form
  `dvfs-mlops train` registers as a stdlib policy.json) and of FFG's joint analogue (one configuration for every
  workload, the least mean normalised cost on the training workloads); target <= 0.3 % mean;
- the mean saving against every clock at its top of: the governor's held-out picks, the GPU-only oracle (the best GPU
  clock with CPU and EMC at their tops: the ceiling of any GPU-only governor), the joint oracle;
- the measuring-less joint search (`model.joint`, what `sweep --strategy adaptive --knobs gpu,cpu,emc` runs) on the
  same noise-free twin, per workload of the first task: configurations measured, regret against the joint oracle, its
  saving next to the GPU-only oracle's.

Features: num_layers, hidden_size, log10 parameters, the task's mean length, decoder or not, and the twin's GPU
utilisation at maxn (as the GPU-only governor reads them).

    python -m benchmarks.governor_joint                       # sim-orin, every task
    python -m benchmarks.governor_joint --tasks sst2,rte,mrpc --profile sim-orin-nx-16gb
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import numpy as np


def table(profile: str, tasks: list[str]) -> tuple:
    """(ConfigurationTable of expected joint energy, energy at the top configuration per workload, GPU-only oracle per
    workload), on the twin `profile`."""
    from dvfs_mlops.clocks import MAXN, Setting
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.profiles import builtin_profile
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.workloads.tasks import TASKS
    from dvfs_mlops.job.workloads.zoo import PRESETS
    from dvfs_mlops.model.governor.configurations import ConfigurationTable

    params = builtin_profile(profile)
    dev = SimDevice(params=params)
    settings = tuple(itertools.starmap(Setting, itertools.product(dev.frequencies_mhz, dev.cpu_frequencies_mhz, dev.emc_frequencies_mhz)))
    top = Setting(max(dev.frequencies_mhz), max(dev.cpu_frequencies_mhz), max(dev.emc_frequencies_mhz))
    cache = TraceCache()
    names, feats, costs, times, groups, tops, gpu_only = [], [], [], [], [], [], []
    for model, task in itertools.product(PRESETS, tasks):
        config = PRESETS[model].config()
        tokens = TASKS[task].mean_tokens
        trace = cache.get(config, 16, tokens)
        expected = [dev.expected(trace, s) for s in settings]
        energy = np.array([e.energy_joint_expected_j for e in expected])
        times.append([e.time_expected_s for e in expected])
        util = dev.expected(trace, MAXN).gpu_util
        n_params = _params(config)
        names.append(f"{model}/{task}")
        feats.append([config.num_hidden_layers, config.hidden_size, math.log10(n_params), tokens,
                      float("gpt" in config.model_type or "neox" in config.model_type), 100.0 * util])
        costs.append(energy)
        groups.append(task)
        by = dict(zip(settings, energy))
        tops.append(by[top])
        gpu_only.append(min(by[Setting(f, top.cpu_mhz, top.emc_mhz)] for f in dev.frequencies_mhz))
    t = ConfigurationTable(settings, tuple(names), np.array(feats), ("num_layers", "hidden_size", "log10_params", "avg_seq_len",
                           "decoder", "gpu_util_pct"), np.array(costs), tuple(groups))
    return t, np.array(tops), np.array(gpu_only), np.array(times)


def _params(config: object) -> float:
    """The parameter count of a transformer config, from its sizes (embeddings, attention and MLP per layer)."""
    h = config.hidden_size
    layers = config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * h)
    vocab = getattr(config, "vocab_size", 30522)
    return float(vocab * h + layers * (4 * h * h + 2 * h * inter))


def run(profile: str, tasks: list[str]) -> list[str]:
    from dvfs_mlops.model.governor.configurations import fit_configuration_tree, nested_regret

    t0 = time.perf_counter()
    t, tops, gpu_only, times = table(profile, tasks)
    built = time.perf_counter() - t0
    governor, fixed = nested_regret(t)
    judged = time.perf_counter() - t0 - built
    trees, _ = nested_regret(t, kinds=("tree",))  # what `dvfs-mlops train` registers: a forest has no policy.json form
    oracle = t.cost.min(axis=1)
    picked = oracle * (1.0 + governor)
    whole = fit_configuration_tree(t)
    gpu_regret = gpu_only / oracle - 1
    rows = [("governor of configurations (one task out)", governor, picked),
            ("... trees only, as `train` registers it", trees, oracle * (1.0 + trees)),
            ("one fixed configuration (FFG joint)", fixed, oracle * (1 + fixed)),
            ("GPU-only oracle (CPU, EMC at top)", gpu_regret, gpu_only),
            ("joint oracle", np.zeros(len(oracle)), oracle)]
    lines = [(f"profile {profile} (SIMULATED), {len(t.workloads)} workloads ({len(set(t.groups))} tasks), "
              f"{len(t.settings)} configurations each; table {built:.1f} s, nested CV {judged:.1f} s"),
             "| policy | held-out regret mean | max | saving vs every clock at top (mean) |", "|---|---|---|---|"]
    lines += [f"| {name} | {100 * r.mean():.3f} % | {100 * r.max():.2f} % | {100 * (1 - e / tops).mean():.2f} % |" for name, r, e in rows]
    picks = (sorted({s.label() for s in whole.pick(t.features)}) if whole.tree is not None
             else [t.settings[whole.fixed].label()])
    lines.append(f"the governor fitted on every workload: a {whole.kind}, depth {whole.depth}, min leaf {whole.min_leaf}; picks {picks}")
    lines += searched(t, times, tops, gpu_only, tasks[0])
    return lines


def searched(t: object, times: np.ndarray, tops: np.ndarray, gpu_only: np.ndarray, task: str) -> list[str]:
    """The joint search per workload of `task` on the noise-free twin (the adaptive sweep's `JointSearch`, energy,
    budget 20, starting mid-table), and its mean over every workload of the table."""
    from dvfs_mlops.model.joint import JointSearch, JointSpace, search

    space = JointSpace(*(tuple(sorted({getattr(s, k) for s in t.settings})) for k in ("gpu_mhz", "cpu_mhz", "emc_mhz")))
    column = {s: i for i, s in enumerate(t.settings)}
    rows = ["", f"the joint search (budget 20, energy) on the noise-free twin, per workload of {task}:",
            "| workload | configurations | pick | regret | saving: joint search / GPU-only oracle / joint oracle |", "|---|---|---|---|---|"]
    regrets, counts = [], []
    for i, name in enumerate(t.workloads):
        def measure(s: object, i: int = i) -> object:
            from dvfs_mlops.model.joint import Measured

            j = column[s]
            return Measured(s, float(times[i, j]), float(t.cost[i, j]))

        found = search(measure, JointSearch(space, budget=20))
        e = t.cost[i, column[found.pick]]
        regrets.append(e / t.cost[i].min() - 1)
        counts.append(found.configurations)
        if t.groups[i] == task:
            rows.append(f"| {name} | {found.configurations} | {found.pick.label()} | {100 * regrets[-1]:.2f} % | "
                        f"{100 * (1 - e / tops[i]):.1f} % / {100 * (1 - gpu_only[i] / tops[i]):.1f} % / {100 * (1 - t.cost[i].min() / tops[i]):.1f} % |")
    rows.append(f"every workload ({len(regrets)}): regret mean {100 * np.mean(regrets):.2f} %, max {100 * np.max(regrets):.2f} %; "
                f"configurations measured mean {np.mean(counts):.1f}, max {max(counts)}")
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.governor_joint", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="sim-orin")
    parser.add_argument("--tasks", default="sst2,qnli,mrpc,qqp,rte,cola,stsb,mnli,wnli")
    args = parser.parse_args(argv)
    for line in run(args.profile, args.tasks.split(",")):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
