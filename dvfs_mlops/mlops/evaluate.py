"""`dvfs-mlops evaluate`: each policy's clock on held-out workloads, read from a sweep's points.

A twin point is one noisy draw, so the truth is the twin's expected (noise-free) curve where the
runs logged it (metrics energy_expected_j, time_expected_s), else the mean over repeats (hardware).
Savings are against MAXN (1 - E/E_maxn, on the truth), regret against the oracle under the
objective: `regret` against the measured (mean-over-repeats) oracle, `regret_expected` against the
expected one (twin only), each with a bootstrap 95 % interval over workloads. Means overall and by
size (<= 70M, > 70M parameters), the largest saving and the worst case.

A joint sweep (`sweep --knobs gpu,cpu[,emc] --strategy grid`) is judged on its configuration table
(`joint_dataset`): GPU-only and joint policies side by side on the same named energy metric (the joint
rails, expected where the twin logged it) at the same objective, each regret against the joint oracle
(`evaluate_joint`). Its policies (`JOINT_POLICIES`): the GPU-only oracle (the best GPU clock with the CPU
and memory clocks at their tops), FFG (one GPU clock, CPU and EMC at top), the fixed configuration (FFG's
joint analogue), the joint oracle, maxn, and governors (a GPU-only one runs CPU and EMC at their tops).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.clocks import MAXN, Setting, freq_label
from dvfs_mlops.errors import DvfsError, unknown
from dvfs_mlops.mlops import lifecycle, schema
from dvfs_mlops.mlops.dataset import dataset_from_frame, is_replayed, read_sweep_points
from dvfs_mlops.mlops.governor import Governor
from dvfs_mlops.mlops.joint_dataset import JointDataset, joint_dataset_from_points
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT
from dvfs_mlops.model.governor.dataset import GovernorDataset, WorkloadCurve
from dvfs_mlops.model.governor.objectives import Objective, parse_objective
from dvfs_mlops.model.governor.policies import (
    FixedPolicy,
    MaxNPolicy,
    OraclePolicy,
    choice_for,
    paper_tree,
)
from dvfs_mlops.model.workload import SMALL_MODEL_PARAMS

if TYPE_CHECKING:
    from dvfs_mlops.clocks import FreqRequest
    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.model.workload import WorkloadFeatures

logger = logging.getLogger(__name__)

BUILTIN = ("production", "ffg", "paper-mlg", "maxn", "oracle")
# On a joint sweep: the default side by side, and the policies that exist only there.
JOINT_POLICIES = ("production", "gpu-oracle", "ffg", "fixed-configuration", "oracle", "maxn")
JOINT_ONLY = ("gpu-oracle", "fixed-configuration")
JOINT_ORACLE = "joint oracle"  # the label of the policy "oracle" on a joint sweep (its MLflow keys are oracle_*)


@dataclasses.dataclass(frozen=True)
class EvaluateRequest:
    """What `dvfs-mlops evaluate` is asked.

    Attributes:
        sweep_id: the sweep ('': the newest in `experiment` with workloads of `split`, never a calibration sweep).
        experiment: where the sweep's runs are.
        split: eval (held-out workloads), train or all.
        policies: comma-separated policy names (`BUILTIN`) or models:/ URIs.
        objective: energy, edp or max-slowdown:X.
    """

    sweep_id: str = ""
    experiment: str = SWEEP_EXPERIMENT
    split: str = "eval"
    policies: str = ",".join(BUILTIN)
    objective: str = "energy"

    @property
    def policy_names(self) -> list[str]:
        return [p.strip() for p in self.policies.split(",") if p.strip()]


@dataclasses.dataclass
class GovernorPolicy:
    """A registered governor (any models:/ URI, `load_governor`) as a policy."""

    governor: Governor
    name: str
    objective: str | None = None  # passed to a curve governor; one that refuses it (a classifier) decides for its own

    def choose(self, features: WorkloadFeatures | dict[str, Any], frequencies: Sequence[float] | None = None) -> float:
        table = list(frequencies or [])
        if self.objective:
            try:
                return self.governor.decide(features, table, self.objective).freq_mhz
            except DvfsError as e:  # a classifier trained for one objective refuses another
                logger.debug("%s decides for its own objective, not %s: %s", self.name, self.objective, e)
        return self.governor.decide(features, table).freq_mhz


@dataclasses.dataclass(frozen=True)
class PolicyRow:
    workload: str
    policy: str
    freq: str
    energy_j: float
    time_s: float
    accuracy: float | None
    saving_vs_maxn: float  # on the truth (expected where logged)
    regret_vs_oracle: float  # against the measured (mean-over-repeats) oracle
    num_params: int
    regret_vs_expected: float | None = None  # against the expected oracle (twin only)


@dataclasses.dataclass(frozen=True)
class PolicySummary:
    policy: str
    n: int
    mean_saving: float
    mean_saving_small: float | None
    mean_saving_big: float | None
    max_saving: float
    max_saving_workload: str
    worst_saving: float
    worst_workload: str
    mean_regret: float
    mean_regret_expected: float | None = None
    regret_ci: tuple[float, float] | None = None  # of mean_regret_expected where present, else of mean_regret

    def as_json(self, simulated: bool) -> dict[str, Any]:
        """The `evaluate --json` object: all fractions."""
        regret = None if math.isnan(self.mean_regret) else self.mean_regret  # a joint table without a measured energy
        return {"policy": self.policy, "n": self.n, "saving": self.mean_saving, "regret": regret,
                "regret_expected": self.mean_regret_expected, "regret_ci": list(self.regret_ci) if self.regret_ci else None,
                "saving_small": self.mean_saving_small, "saving_big": self.mean_saving_big, "max_saving": self.max_saving,
                "worst_saving": self.worst_saving, "simulated": simulated}


@dataclasses.dataclass
class EvalReport:
    sweep_id: str
    split: str
    objective: str
    simulated: bool
    rows: list[PolicyRow]
    summaries: list[PolicySummary]
    run_id: str | None = None
    experiment: str = ""  # the run's experiment (under `mlflow run`: the one MLflow chose)
    replayed: bool = False  # the sweep looked its points up in a measured grid (`--device replay`)
    energy_metric: str = ""  # a joint sweep's: the energy every policy is judged on (energy_joint_expected_j ...)
    knobs: dict[str, str] = dataclasses.field(default_factory=dict)  # a joint sweep's: the clocks each policy decides
    regret_metric: str = ""  # a joint sweep's: the measured energy `regret` is on ('' where none: only `expected`)

    @property
    def label(self) -> str:
        """' (SIMULATED)' on the twin's sweep, ' (REPLAYED)' on a measured grid's, '' on a live one."""
        return " (SIMULATED)" if self.simulated else " (REPLAYED)" if self.replayed else ""

    def to_json(self) -> list[dict[str, Any]]:
        """`evaluate --json`: one object per policy (on a joint sweep with the energy metric and the clocks it decides)."""
        joint = {"energy_metric": self.energy_metric} if self.energy_metric else {}
        return [{**s.as_json(self.simulated), **joint, **({"knobs": self.knobs[s.policy]} if s.policy in self.knobs else {})}
                for s in self.summaries]

    def to_dict(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "split": self.split, "objective": self.objective, "simulated": self.simulated,
                "run_id": self.run_id, "summaries": [dataclasses.asdict(s) for s in self.summaries],
                "rows": [dataclasses.asdict(r) for r in self.rows]}


def _point(curve: WorkloadCurve, freq: FreqRequest) -> tuple[float, float, float | None]:
    """(measured energy, measured time, accuracy) at a policy's choice; a clock the workload lacks is judged at its nearest."""
    if freq == MAXN:
        return curve.maxn_energy_j, curve.maxn_time_s, curve.accuracy.get(MAXN)
    f = curve.nearest(float(freq))
    return curve.energy_j[f], curve.time_s[f], curve.accuracy.get(freq_label(f))


def _truth_energy(curve: WorkloadCurve, freq: FreqRequest) -> float:
    e, _, _, maxn_e = curve.truth()
    return maxn_e if freq == MAXN else e[curve.nearest(float(freq))]


def _regret(curve: WorkloadCurve, freq: FreqRequest, objective: Objective, expected: bool) -> float:
    """Regret of a choice (maxn included: charged its own energy and time) against the oracle of one curve."""
    if expected:
        e, t, mt, maxn_e = curve.truth()
    else:
        e, t, mt, maxn_e = curve.energy_j, curve.time_s, curve.maxn_time_s, curve.maxn_energy_j
    if freq != MAXN:
        return objective.regret(curve.nearest(float(freq)), e, t, mt)
    best = objective.best(e, t, mt)  # maxn is never the oracle (a pinned clock is), but it is charged by the same rule
    oracle = e[best] * t[best] if objective.kind == "edp" else e[best]
    return (maxn_e * mt if objective.kind == "edp" else maxn_e) / oracle - 1.0


def evaluate_dataset(dataset: GovernorDataset, policies: dict[str, Any], objective: Objective, split: str = "eval") -> EvalReport:
    """Pure evaluation (no MLflow): rows per workload x policy, and summaries."""
    curves = dataset.curves if split == "all" else dataset.split(split).curves
    if not curves:
        raise DvfsError(f"sweep {dataset.sweep_id} has no {split!r} workloads to evaluate (the paper preset has eval tasks; or use --split train)")
    rows: list[PolicyRow] = []
    for c in curves:
        for name, policy in policies.items():
            freq = choice_for(policy, c, dataset.frequencies)
            e, t, acc = _point(c, freq)
            _, _, _, maxn_e = c.truth()
            rows.append(PolicyRow(c.workload, name, freq_label(freq), e, t, acc, 1.0 - _truth_energy(c, freq) / maxn_e,
                                  _regret(c, freq, objective, expected=False), c.features.num_params,
                                  _regret(c, freq, objective, expected=True) if c.has_expected else None))
    return EvalReport(dataset.sweep_id, split, objective.name, dataset.simulated, rows, summarise(rows, list(policies)),
                      replayed=is_replayed(dataset))


def summarise(rows: Sequence[PolicyRow], order: Sequence[str]) -> list[PolicySummary]:
    from dvfs_mlops.model.governor.search import bootstrap_ci

    out = []
    for name in order:
        rs = [r for r in rows if r.policy == name]
        if not rs:
            continue
        small = [r.saving_vs_maxn for r in rs if r.num_params <= SMALL_MODEL_PARAMS]
        big = [r.saving_vs_maxn for r in rs if r.num_params > SMALL_MODEL_PARAMS]
        best = max(rs, key=lambda r: r.saving_vs_maxn)
        worst = min(rs, key=lambda r: r.saving_vs_maxn)
        expected = [r.regret_vs_expected for r in rs if r.regret_vs_expected is not None]
        has_expected = len(expected) == len(rs)
        judged = expected if has_expected else [r.regret_vs_oracle for r in rs]
        out.append(PolicySummary(name, len(rs), float(np.mean([r.saving_vs_maxn for r in rs])),
                                 float(np.mean(small)) if small else None, float(np.mean(big)) if big else None,
                                 best.saving_vs_maxn, best.workload, worst.saving_vs_maxn, worst.workload,
                                 float(np.mean([r.regret_vs_oracle for r in rs])),
                                 float(np.mean(expected)) if has_expected else None, bootstrap_ci(judged)))
    return out


def check_policies(names: Sequence[str]) -> None:
    """Every name is a built-in policy or a models:/ URI.

    Raises:
        UnknownNameError: a name that is neither (the message lists the valid ones).
    """
    for name in names:
        if name not in BUILTIN and name not in JOINT_ONLY and not name.startswith("models:/"):
            raise unknown("policy", name, [*BUILTIN, *JOINT_ONLY, "models:/NAME/VERSION", "models:/NAME@ALIAS"])


def _named_governor(name: str, board: Board | None, say: Callable[[str], None]) -> tuple[Governor, str, str] | None:
    """"production" (the production governor of `board`'s family, or the registry's) or a models:/ URI, loaded: the
    governor, its row label and the clocks it decides ("gpu" or e.g. "gpu,cpu,emc"); None where "production" does not
    load (said in one line).

    Raises:
        DvfsError: a models:/ URI that does not load.
    """
    from dvfs_mlops.mlops.governor import load_governor
    from dvfs_mlops.mlops.registry import version_knobs

    try:
        governor = load_governor(board=board) if name == "production" and board is not None \
            else load_governor(None if name == "production" else name)
    except DvfsError as e:
        if name == "production":
            say(f"skipping 'production': {e}")
            return None
        raise
    label = name if name != "production" else f"production (v{governor.ref.version})"
    return governor, label, version_knobs(governor.ref.tags) if governor.ref.name else "gpu"


def build_policies(names: Sequence[str], dataset: GovernorDataset, objective: Objective,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """The GPU-only policies named (built-ins, "production", models:/ URIs) for a GPU-only sweep's dataset.

    Raises:
        DvfsError: an unknown name, no training workloads for FFG, a models:/ URI that does not load, or one that names
            a governor of configurations (evaluate it on a joint sweep: "production" of that kind is skipped, said).
    """
    policies: dict[str, Any] = {}
    for name in names:
        if name == "maxn":
            policies[name] = MaxNPolicy()
        elif name == "oracle":
            policies[name] = OraclePolicy(objective)
        elif name == "ffg":
            train = dataset.split("train").curves
            if not train:
                raise DvfsError(f"sweep {dataset.sweep_id} has no training workloads to fit FFG on")
            policies[name] = FixedPolicy.fit(train, objective)
        elif name == "paper-mlg":
            policies[name] = paper_tree()
        elif name == "production" or name.startswith("models:/"):
            named = _named_governor(name, dataset.board, say)
            if named is None:
                continue
            governor, label, knobs = named
            if knobs != "gpu":  # its CPU and memory clocks have no curve here: judging its GPU clock alone says nothing true
                refusal = (f"{label} is a governor of configurations ({knobs}) and sweep {dataset.sweep_id} tunes the GPU clock "
                           "alone: evaluate it on a joint sweep (dvfs-mlops sweep --knobs gpu,cpu,emc --strategy grid)")
                if name == "production":
                    say(f"skipping {refusal}")
                    continue
                raise DvfsError(refusal)
            policies[label] = GovernorPolicy(governor, label, objective.name)
        else:
            raise unknown("policy", name, [*BUILTIN, "models:/NAME/VERSION", "models:/NAME@ALIAS"])
    return policies


def format_table(report: EvalReport) -> str:
    def pct(x: float | None) -> str:
        return "   -  " if x is None or math.isnan(x) else f"{100 * x:6.2f}%"

    label = report.label
    expected = any(s.mean_regret_expected is not None for s in report.summaries)
    lines = [f"sweep {report.sweep_id}{label}, split {report.split}, objective {report.objective}",
             (f"{'policy':<24} {'n':>3} {'saving':>8} {'<=70M':>8} {'>70M':>8} {'max':>8} {'worst':>8} {'regret':>8} "
              f"{'expected':>8} {'95% CI':>16}  max / worst workload")]
    for s in report.summaries:
        ci = f"[{100 * s.regret_ci[0]:.2f},{100 * s.regret_ci[1]:.2f}]%" if s.regret_ci else "-"
        lines.append(f"{s.policy:<24} {s.n:>3} {pct(s.mean_saving):>8} {pct(s.mean_saving_small):>8} {pct(s.mean_saving_big):>8} "
                     f"{pct(s.max_saving):>8} {pct(s.worst_saving):>8} {pct(s.mean_regret):>8} {pct(s.mean_regret_expected):>8} "
                     f"{ci:>16}  {s.max_saving_workload} / {s.worst_workload}")
    truth = "the expected (noise-free) curve" if expected else "the mean over repeats"
    if report.energy_metric:  # a joint sweep: the energy every policy is judged on, and the clocks each decides
        lines = [*lines[:1], f"energy metric: {report.energy_metric}",
                 lines[1] + "  knobs", *(line + f"  {report.knobs.get(s.policy, '-')}" for line, s in zip(lines[2:], report.summaries))]
        on = (f"against the measured oracle on {report.regret_metric}" if report.regret_metric else
              "not measured (the sweep logged the expected energy only)")
        lines.append(f"saving = 1 - E/E(maxn) on {report.energy_metric}; regret = cost/cost(oracle) - 1 {on}"
                     + (f", expected = against the expected oracle on {report.energy_metric}" if expected else "")
                     + f"; 95% CI: bootstrap over workloads of {'expected' if expected else 'regret'}")
    else:
        lines.append(f"saving = 1 - E/E(maxn) on {truth}; regret = cost/cost(oracle) - 1 against the measured oracle"
                     + (", expected = against the expected oracle" if expected else "")
                     + f"; 95% CI: bootstrap over workloads of {'expected' if expected else 'regret'}")
    if report.run_id:
        lines.append(f"logged run {report.run_id} in {report.experiment or schema.EVALUATE_EXPERIMENT}")
    return "\n".join(lines)


def savings_chart(report: EvalReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.policy for s in report.summaries]
    groups = [("all", [s.mean_saving for s in report.summaries]), ("<= 70M", [s.mean_saving_small or 0 for s in report.summaries]),
              ("> 70M", [s.mean_saving_big or 0 for s in report.summaries])]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4))
    for i, (label, vals) in enumerate(groups):
        ax.bar(x + (i - 1) * 0.27, [100 * v for v in vals], 0.27, label=label)
    ax.set_xticks(x, names, rotation=15)
    ax.set_ylabel("energy saving vs MAXN (%)")
    ax.axhline(0, color="black", lw=0.8)
    ax.legend()
    ax.set_title(f"sweep {report.sweep_id}, {report.split} workloads{report.label}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def evaluate_sweep(sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, split: str = "eval",
                   policies: Sequence[str] = BUILTIN, objective: str = "energy", log: bool = True,
                   say: Callable[[str], None] = logger.info) -> EvalReport:
    """Compare `policies` on a sweep's measured points and (with `log`) log the comparison as one run of
    `dvfs-evaluate` (`lifecycle.owned_run`: it exists from the start, ends FAILED with the reason when the evaluation
    fails, KILLED when stopped).

    Args:
        sweep_id: the sweep (None: the newest in `experiment` with `split` workloads, never a calibration sweep).
        experiment: where the sweep's runs are.
        split: eval, train or all.
        policies: policy names or models:/ URIs.
        objective: energy, edp or max-slowdown:X.
        log: log the run (False: compare only).
        say: where progress lines go.

    Returns:
        The `EvalReport` (its `run_id` and `experiment` where logged).

    Raises:
        DvfsError: an unknown objective or policy, no such sweep, no workloads of the split.
    """
    obj = parse_objective(objective)
    check_policies(policies)
    points = read_sweep_points(sweep_id, experiment, split=split, say=say)  # the input: refused before any run is made
    joint = joint_dataset_from_points(points) if points.joint else None
    dataset = None if points.joint else dataset_from_frame(points.frame, points.label, points.device_profile, points.simulated, points.board)
    if joint is not None and list(policies) == list(BUILTIN):
        policies = list(JOINT_POLICIES)
    only = [p for p in policies if p in JOINT_ONLY]
    if joint is None and only:
        raise DvfsError(f"policy {only[0]!r} compares configurations: evaluate it on a joint sweep (sweep --knobs gpu,cpu,emc)")

    def compare() -> EvalReport:
        if joint is not None:
            return evaluate_joint(joint, policies, obj, split, say)
        assert dataset is not None
        return evaluate_dataset(dataset, build_policies(policies, dataset, obj, say), obj, split)

    if not log:
        return compare()
    replayed = points.replayed
    tags = {schema.TAG_SWEEP: points.label, schema.TAG_SIMULATED: str(points.simulated).lower(),
            **({schema.TAG_DEVICE: "replay"} if replayed else {})}
    with lifecycle.owned_run(schema.EVALUATE_EXPERIMENT, name=f"evaluate {points.label} {split}", tags=tags) as run:
        run.log_batch(params={"sweep_id": points.label, "split": split, "objective": obj.name, "policies": ",".join(policies),
                              **({"energy_metric": joint.metric, "knobs": ",".join(joint.tuned)} if joint is not None else {})})
        report = compare()
        run.log_batch(metrics=_summary_metrics(report.summaries))
        _log_tables(run, report)
        report.run_id, report.experiment = run.run_id, run.experiment_name
    return report


def _summary_metrics(summaries: Sequence[PolicySummary]) -> dict[str, float | None]:
    """Each policy's summary as metrics: `<policy>_mean_saving`, `_max_saving`, `_worst_saving`, `_mean_regret`, and where
    known `_mean_regret_expected`, `_regret_ci_low`/`_high`, `_mean_saving_small`/`_big`."""
    metrics: dict[str, float | None] = {}
    for s in summaries:
        # the joint oracle is the policy asked as "oracle": its keys are oracle_*, as the GPU-only oracle's
        key = "oracle" if s.policy == JOINT_ORACLE else s.policy.split(" ")[0].replace(":", "_").replace("/", "_").replace("@", "_")
        regret = None if math.isnan(s.mean_regret) else s.mean_regret  # a joint table without a measured energy
        metrics.update({f"{key}_mean_saving": s.mean_saving, f"{key}_max_saving": s.max_saving,
                        f"{key}_worst_saving": s.worst_saving, f"{key}_mean_regret": regret,
                        f"{key}_mean_regret_expected": s.mean_regret_expected, f"{key}_mean_saving_small": s.mean_saving_small,
                        f"{key}_mean_saving_big": s.mean_saving_big})
        if s.regret_ci is not None:
            metrics[f"{key}_regret_ci_low"], metrics[f"{key}_regret_ci_high"] = s.regret_ci
    return metrics


def _log_tables(run: lifecycle.OwnedRun, report: EvalReport) -> None:
    """evaluation.csv (every workload x policy), summary.csv and savings.png."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        pd.DataFrame([dataclasses.asdict(r) for r in report.rows]).to_csv(Path(tmp) / "evaluation.csv", index=False)
        pd.DataFrame([dataclasses.asdict(s) for s in report.summaries]).to_csv(Path(tmp) / "summary.csv", index=False)
        savings_chart(report, Path(tmp) / "savings.png")
        run.client.log_artifacts(run.run_id, tmp)


def joint_costs(objective: Objective, cost: np.ndarray, slowdown: np.ndarray) -> np.ndarray:
    """Each configuration's cost under `objective` (rows x columns): energy; energy x time (edp); or, for
    max-slowdown:X, energy where the slowdown against maxn is at most X, else infinite (as `Objective.costs`)."""
    if objective.kind == "energy":
        return cost
    if objective.kind == "edp":
        return cost * slowdown
    return np.where(slowdown <= objective.max_slowdown * (1 + 1e-9), cost, np.inf)  # type: ignore[operator]


def _best(costs: np.ndarray, slowdown: np.ndarray, columns: Sequence[int]) -> int:
    """The least-cost column among `columns` (ties: the later, faster one); none feasible: the fastest (`Objective.best`)."""
    cols = list(columns)
    feasible = [j for j in cols if np.isfinite(costs[j])]
    if not feasible:
        return min(cols, key=lambda j: (slowdown[j], -j))
    return min(feasible, key=lambda j: (costs[j], -j))


def _joint_regret(costs: np.ndarray, slowdown: np.ndarray, energy: np.ndarray, chosen: float, chosen_energy: float) -> float:
    """cost(chosen)/cost(joint oracle) - 1 for one workload; an infeasible choice is charged the worst feasible cost,
    x2 (`Objective.regret`)."""
    best = _best(costs, slowdown, range(len(costs)))
    oracle, c = costs[best], chosen
    if not math.isfinite(c):
        finite = costs[np.isfinite(costs)]
        c = 2 * float(finite.max()) if len(finite) else chosen_energy
        oracle = oracle if math.isfinite(oracle) else energy[best]
    return float(c / oracle - 1.0)


def _fixed_column(costs: np.ndarray, columns: Sequence[int], settings: Sequence[Setting]) -> int:
    """FFG's joint rule (`configurations.fixed_column`) over `columns` of the table."""
    from dvfs_mlops.model.governor.configurations import fixed_column

    cols = list(columns)
    return cols[fixed_column(costs[:, cols], [settings[j] for j in cols])]


def _column_of(joint: JointDataset, gpu: float, cpu: float | None, emc: float | None) -> int:
    """The table's column nearest to a configuration (a clock not decided: its top, as a GPU-only governor leaves it)."""
    from dvfs_mlops.model.governor.policy_tree import snap

    settings = joint.table.settings
    top = settings[joint.top]
    g = snap(gpu, sorted({s.gpu_mhz for s in settings}))
    c = top.cpu_mhz if cpu is None or top.cpu_mhz is None else snap(cpu, sorted({s.cpu_mhz for s in settings if s.cpu_mhz is not None}))
    e = top.emc_mhz if emc is None or top.emc_mhz is None else snap(emc, sorted({s.emc_mhz for s in settings if s.emc_mhz is not None}))
    return min(range(len(settings)), key=lambda j: (settings[j].gpu_mhz != g, settings[j].cpu_mhz != c, settings[j].emc_mhz != e,
                                                    abs(settings[j].gpu_mhz - g)))


def _constant(column: int) -> Callable[[int], int | None]:
    """A fixed policy: the same column for every row."""
    return lambda _row: column


def _joint_choosers(joint: JointDataset, names: Sequence[str], objective: Objective,
                    say: Callable[[str], None]) -> tuple[dict[str, Callable[[int], int | None]], dict[str, str]]:
    """Each policy as a function of a workload's row -> its column (None: maxn), and the clocks each decides."""
    train = joint.split("train")
    if not train.table.workloads and any(n in ("ffg", "fixed-configuration") for n in names):
        raise DvfsError(f"sweep {joint.sweep_id} has no training workloads to fit FFG and the fixed configuration on")
    costs = joint_costs(objective, joint.table.cost, joint.slowdown)
    gpu_cols, every = joint.gpu_only_columns(), range(len(joint.table.settings))
    tables = {k: sorted({getattr(s, k) for s in joint.table.settings if getattr(s, k) is not None}) for k in ("gpu_mhz", "cpu_mhz", "emc_mhz")}
    knobs = ",".join(joint.tuned)
    out: dict[str, Callable[[int], int | None]] = {}
    decides: dict[str, str] = {}
    for name in names:
        if name == "maxn":
            out[name], decides[name] = (lambda i: None), "none"
        elif name == "oracle":
            out[JOINT_ORACLE], decides[JOINT_ORACLE] = (lambda i: _best(costs[i], joint.slowdown[i], every)), knobs
        elif name == "gpu-oracle":
            out[name], decides[name] = (lambda i: _best(costs[i], joint.slowdown[i], gpu_cols)), "gpu"
        elif name in ("ffg", "fixed-configuration"):
            column = _fixed_column(joint_costs(objective, train.table.cost, train.slowdown), gpu_cols if name == "ffg" else every,
                                   joint.table.settings)
            out[name], decides[name] = _constant(column), "gpu" if name == "ffg" else knobs
        elif name == "paper-mlg":
            tree = paper_tree()

            def published(i: int, t: Any = tree) -> int:
                return _column_of(joint, float(t.choose(joint.features[i], tables["gpu_mhz"])), None, None)

            out[name], decides[name] = published, "gpu"
        else:  # production or a models:/ URI
            named = _named_governor(name, joint.board, say)
            if named is None:
                continue
            governor, label, knobs_of_version = named

            def choose(i: int, g: Any = governor) -> int:
                try:
                    c = g.decide(joint.features[i], tables["gpu_mhz"], objective.name, cpu_frequencies=tables["cpu_mhz"] or None,
                                 emc_frequencies=tables["emc_mhz"] or None)
                except DvfsError:  # a classifier trained for one objective decides for its own
                    c = g.decide(joint.features[i], tables["gpu_mhz"], cpu_frequencies=tables["cpu_mhz"] or None,
                                 emc_frequencies=tables["emc_mhz"] or None)
                return _column_of(joint, c.freq_mhz, c.cpu_mhz, c.emc_mhz)

            out[label], decides[label] = choose, knobs_of_version
    return out, decides


def evaluate_joint(joint: JointDataset, names: Sequence[str], objective: Objective, split: str = "eval",
                   say: Callable[[str], None] = logger.info) -> EvalReport:
    """GPU-only and joint policies side by side on a joint sweep's configuration table (no MLflow run): each workload's
    cost (the table's energy metric) at each policy's configuration, its saving against maxn and its regret against the
    joint oracle under `objective`. Regret is `regret_expected` too where the metric is the twin's expected energy.

    Raises:
        DvfsError: no workloads of `split`, no training workloads for FFG or the fixed configuration, a governor that
            cannot load or decide.
    """
    data = joint.split(split)
    if not data.table.workloads:
        raise DvfsError(f"sweep {joint.sweep_id} has no {split!r} workloads to evaluate (or use --split train)")
    choosers, decides = _joint_choosers(joint, names, objective, say)
    costs = joint_costs(objective, data.table.cost, data.slowdown)
    expected = data.metric.endswith("_expected_j")
    # regret against the measured oracle on the measured table where the sweep logged one (the twin's energy_joint_j),
    # against the expected oracle on the expected table (`regret_expected`), as the GPU-only evaluate does
    measured = data.measured if expected else data
    measured_costs = None if measured is None else joint_costs(objective, measured.table.cost, measured.slowdown)
    rows: list[PolicyRow] = []
    for i, workload in enumerate(data.table.workloads):
        row = joint.table.workloads.index(workload)
        maxn_cost = float(data.maxn_cost[i])
        for name, choose in choosers.items():
            j = choose(row)
            if j is None:
                label, energy, time = MAXN, maxn_cost, float(data.maxn_time_s[i])
                cost = energy  # maxn is its own slowdown reference: feasible under max-slowdown, and x1 under edp
            else:
                label, energy, time, cost = data.table.settings[j].label(), float(data.table.cost[i, j]), float(data.time_s[i, j]), float(costs[i, j])
            regret = _joint_regret(costs[i], data.slowdown[i], data.table.cost[i], cost, energy)
            on_measured = math.nan
            if measured is not None and measured_costs is not None:
                m_energy, m_cost = ((float(measured.maxn_cost[i]),) * 2 if j is None else
                                    (float(measured.table.cost[i, j]), float(measured_costs[i, j])))
                on_measured = _joint_regret(measured_costs[i], measured.slowdown[i], measured.table.cost[i], m_cost, m_energy)
            rows.append(PolicyRow(workload, name, label, energy, time, None, 1.0 - energy / maxn_cost, on_measured,
                                  data.features[i].num_params, regret if expected else None))
    return EvalReport(joint.sweep_id, split, objective.name, joint.simulated, rows, summarise(rows, list(choosers)),
                      replayed=joint.replayed, energy_metric=joint.metric, knobs=decides,
                      regret_metric="" if measured is None else measured.metric)
