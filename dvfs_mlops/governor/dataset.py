"""From a sweep's MLflow runs to one row per workload: features, energy/time curves, label."""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.governor.objectives import Objective
from dvfs_mlops.workloads.adapters import split_variant
from dvfs_mlops.workloads.features import NUMERIC_FEATURES, WorkloadFeatures

if TYPE_CHECKING:
    from dvfs_mlops.curve import PowerPrior

log = logging.getLogger(__name__)

__all__ = ["NUMERIC_FEATURES", "GovernorDataset", "WorkloadCurve", "dataset_from_frame", "feature_matrix", "load_sweep_dataset",
           "unheld_points", "warn_unheld_clocks"]


@dataclasses.dataclass
class WorkloadCurve:
    """One workload's curves. `energy_j`/`time_s` are measured (mean over repeats); the `*_expected_*` ones are the
    twin's noise-free values (metrics energy_expected_j, time_expected_s), empty on hardware and on older runs.

    A partial sweep leaves some clocks out: every method works on the clocks this workload has."""

    workload: str  # "bert-base/rte"
    split: str  # train | eval
    features: WorkloadFeatures  # gpu_util_pct measured at maxn
    energy_j: dict[float, float]  # mean over repeats, per pinned clock
    time_s: dict[float, float]
    maxn_energy_j: float
    maxn_time_s: float
    accuracy: dict[str, float] = dataclasses.field(default_factory=dict)  # freq label -> eval metric
    energy_expected_j: dict[float, float] = dataclasses.field(default_factory=dict)
    time_expected_s: dict[float, float] = dataclasses.field(default_factory=dict)
    maxn_energy_expected_j: float | None = None
    maxn_time_expected_s: float | None = None
    gpu_util_pct: dict[float, float] = dataclasses.field(default_factory=dict)  # mean over repeats, per measured pinned clock

    @property
    def model(self) -> str:
        return self.workload.split("/", 1)[0]

    @property
    def task(self) -> str:
        """The task without the workload's variant: a LoRA job on sst2 is held out with sst2."""
        return split_variant(self.workload.split("/", 1)[-1])[0]

    @property
    def clocks(self) -> list[float]:
        """The pinned clocks this workload measured, ascending."""
        return sorted(self.energy_j)

    @property
    def has_expected(self) -> bool:
        """True when the noise-free curve covers every measured clock and maxn."""
        return (bool(self.energy_expected_j) and set(self.energy_j) <= set(self.energy_expected_j)
                and set(self.energy_j) <= set(self.time_expected_s) and self.maxn_time_expected_s is not None)

    def truth(self) -> tuple[dict[float, float], dict[float, float], float, float]:
        """(energy, time, maxn time, maxn energy) to judge a choice by: expected where logged, else the measured mean."""
        if self.has_expected:
            e = {f: self.energy_expected_j[f] for f in self.energy_j}
            t = {f: self.time_expected_s[f] for f in self.energy_j}
            return e, t, float(self.maxn_time_expected_s), float(self.maxn_energy_expected_j or self.maxn_energy_j)  # type: ignore[arg-type]
        return dict(self.energy_j), dict(self.time_s), self.maxn_time_s, self.maxn_energy_j

    def label(self, objective: Objective) -> float:
        """The measured best clock: what a classifier learns from (all hardware can give)."""
        return objective.best(self.energy_j, self.time_s, self.maxn_time_s)

    def true_label(self, objective: Objective) -> float:
        e, t, mt, _ = self.truth()
        return objective.best(e, t, mt)

    def regret(self, chosen: float, objective: Objective) -> float:
        """Regret against the truth (the expected oracle where logged, else the mean-over-repeats one)."""
        e, t, mt, _ = self.truth()
        return objective.regret(self.nearest(chosen), e, t, mt)

    def regret_measured(self, chosen: float, objective: Objective) -> float:
        return objective.regret(self.nearest(chosen), self.energy_j, self.time_s, self.maxn_time_s)

    def nearest(self, freq: float) -> float:
        """The measured clock nearest to `freq` (ties go up): a policy is judged among the clocks that were measured."""
        f = float(freq)
        return f if f in self.energy_j else min(self.energy_j, key=lambda c: (abs(c - f), -c))

    def normalised(self, truth: bool = False) -> tuple[dict[float, float], dict[float, float]]:
        """(E/E_min, T/T_maxn) per measured clock: the shape of the curve, comparable across workload sizes."""
        e, t, mt, _ = self.truth() if truth else (self.energy_j, self.time_s, self.maxn_time_s, self.maxn_energy_j)
        lo = min(e.values())
        return {f: v / lo for f, v in e.items()}, {f: v / mt for f, v in t.items()}


@dataclasses.dataclass
class GovernorDataset:
    curves: list[WorkloadCurve]
    frequencies: list[float]
    sweep_id: str
    device_profile: str
    simulated: bool
    repeats: int = 1  # runs per measured point (the median): a point's mean is that much less noisy than one run

    def split(self, name: str | None) -> GovernorDataset:
        if name is None:
            return self
        return dataclasses.replace(self, curves=[c for c in self.curves if c.split == name])

    def __len__(self) -> int:
        return len(self.curves)


def _num(v: Any) -> float:
    return float(v)


def unheld_points(df: Any) -> list[str]:
    """Point keys of pinned runs whose measured clock did not hold (tag dvfs.clock_held=false)."""
    from dvfs_mlops import tracking

    col = f"tags.{tracking.TAG_CLOCK_HELD}"
    if col not in df:
        return []
    bad = df[df[col] == "false"]
    key_col = f"tags.{tracking.TAG_POINT}"
    return sorted(str(k) for k in (bad[key_col] if key_col in bad else bad["run_id"]))


def warn_unheld_clocks(df: Any, sweep_id: str = "") -> None:
    """Name the points whose clock strayed: their energy belongs to another clock than the label says."""
    bad = unheld_points(df)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        log.warning("sweep %s: %d point(s) did not hold their pinned clock (throttled or capped), their energy is "
                    "labelled with a clock the GPU did not run at: %s", sweep_id or "?", len(bad), shown)


def _mean_by_clock(g: Any, column: str) -> dict[float, float]:
    if column not in g:
        return {}
    v = g.groupby("_f")[column].mean()
    return {float(k): float(x) for k, x in v.items() if not math.isnan(x)}  # drop NaN (a run without the metric)


def _present_str(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) or value == "" else str(value)


def _optional_int(value: Any) -> int | None:
    text = _present_str(value)
    return None if text is None else int(float(text))


def _maxn_mean(m: Any, column: str) -> float | None:
    v = float(m[column].mean()) if column in m else math.nan
    return None if math.isnan(v) else v


def _adaptive(g: Any) -> bool:
    """An adaptive sweep's workload (sweep/adaptive.py): its unmeasured clocks are left to the curve model."""
    return "tags.dvfs.strategy" in g and bool((g["tags.dvfs.strategy"] == "adaptive").all())


Curves = tuple[dict[float, float], dict[float, float], dict[float, float]]  # energy, time and GPU util % by clock


def power_noise(device_profile: str, repeats: int = 1) -> float:
    """The relative power noise of a sweep point's mean: the twin profile's own per run (else the board default,
    `curve.noise_for`'s), over the square root of the repeats, as the adaptive sweep takes it."""
    from dvfs_mlops.curve import noise_for
    from dvfs_mlops.twin.profiles import BUILTIN_PROFILES

    return noise_for(BUILTIN_PROFILES.get(device_profile))[1] / math.sqrt(max(1, repeats))


def fill_from_curves(measured: Sequence[Curves], freqs: Sequence[float], gaps: Sequence[int], noise: float | None = None) -> float:
    """Predict the clocks the adaptive-sweep workloads `measured[i]` (i in `gaps`) did not measure (their energy,
    time and GPU utilisation by clock; energy and time filled in place) from their own curve fits (curve.py).
    The board's voltage-curve shape is fitted across every workload of the sweep (`measured`): a profile whose curve
    is not the Orin's default would otherwise bias every fill-in, and with it the clock a workload's curve calls
    best. Where the utilisation was logged, each gap's power curve also leans on the board's power prior from
    the sweep's other workloads (power_prior.py), as the sweep's own predictions do; `noise` is a point's relative
    power noise (`power_noise`; default the board default). Returns the shape."""
    from dvfs_mlops.curve import DEFAULT_NOISE, ORIN_VOLTAGE_SHAPE, Measurement, fit_curve, fit_voltage_shape
    from dvfs_mlops.power_prior import leave_one_out_priors

    def points(energy: dict[float, float], time: dict[float, float], util: dict[float, float]) -> list[Measurement]:
        return [Measurement(f, time[f], energy[f], util[f] / 100.0 if f in util else None) for f in energy]

    f_max = max(freqs)
    every = [points(*w) for w in measured]
    try:
        shape = fit_voltage_shape(every, f_max)
    except DvfsError:  # no workload has three clocks: the Orin's shape
        shape = ORIN_VOLTAGE_SHAPE
    noise_p = DEFAULT_NOISE[1] if noise is None else noise
    priors = leave_one_out_priors(every, voltage_shape=shape, f_max_mhz=f_max, noise=noise_p)
    for i in gaps:
        energy, time, _ = measured[i]
        fit = fit_curve(every[i], voltage_shape=shape, f_max_mhz=f_max, noise=(DEFAULT_NOISE[0], noise_p), prior=priors[i])
        for pt in fit.predict([f for f in freqs if f not in energy]):
            energy[pt.freq_mhz], time[pt.freq_mhz] = pt.energy_j, pt.time_s
    return shape


def board_power_prior(dataset: GovernorDataset) -> PowerPrior | None:
    """The board's power prior (power_prior.py) from every workload's measured clocks with their GPU utilisation,
    for refine at launch on workloads the sweep never saw: `train` stores it on the governor version. The voltage
    shape and table top it was fitted with travel with it: a built-in twin profile's own, else the shape fitted
    across the sweep and its highest clock. None without enough workloads that logged utilisation."""
    from dvfs_mlops.curve import ORIN_VOLTAGE_SHAPE, Measurement, fit_voltage_shape, voltage_shape_for
    from dvfs_mlops.power_prior import board_prior
    from dvfs_mlops.twin.profiles import BUILTIN_PROFILES

    points = [[Measurement(f, c.time_s[f], c.energy_j[f], c.gpu_util_pct[f] / 100.0) for f in sorted(c.gpu_util_pct)
               if f in c.energy_j and f in c.time_s] for c in dataset.curves]
    params = BUILTIN_PROFILES.get(dataset.device_profile)
    noise = power_noise(dataset.device_profile, dataset.repeats)
    if params is not None:
        shape, f_max = voltage_shape_for(params), float(params.max_mhz)
    else:
        f_max = max(dataset.frequencies)
        try:
            shape = fit_voltage_shape(points, f_max)
        except DvfsError:
            shape = ORIN_VOLTAGE_SHAPE
    prior = board_prior(points, voltage_shape=shape, f_max_mhz=f_max, noise=noise)
    return None if prior is None else dataclasses.replace(prior, voltage_shape=shape, f_max_mhz=f_max)


def dataset_from_frame(df: Any, sweep_id: str = "", device_profile: str = "", simulated: bool = True) -> GovernorDataset:
    """Rows of `mlflow.search_runs` (params.*, metrics.*, tags.*) -> a dataset.

    Partial sweeps are valid: a workload needs maxn (its gpu_util_pct and the slowdown reference) and at least
    one pinned clock; clocks it lacks are simply not among its choices. Unusable workloads are named."""
    if not len(df):
        raise DvfsError(f"sweep {sweep_id or '?'} has no FINISHED point runs")
    df = df.copy()
    from dvfs_mlops import tracking

    named = f"tags.{tracking.TAG_WORKLOAD}"  # MODEL/TASK plus the variant (+lora-r8a16+bf16) where not full fp32
    df["_workload"] = df["params.model"] + "/" + df["params.task"]
    if named in df:
        df["_workload"] = df[named].fillna(df["_workload"])
    warn_unheld_clocks(df, sweep_id)
    pinned = df[df["params.freq_mhz"] != "maxn"]
    freqs = sorted({_num(f) for f in pinned["params.freq_mhz"]})
    curves: list[WorkloadCurve] = []
    missing: list[str] = []
    measured: list[Curves] = []
    gaps: list[int] = []  # adaptive workloads among `measured`
    for workload, g in df.groupby("_workload", sort=True):
        gp = g[g["params.freq_mhz"] != "maxn"].assign(_f=lambda x: x["params.freq_mhz"].map(_num))
        m = g[g["params.freq_mhz"] == "maxn"]
        if m.empty or gp.empty:
            missing.append(f"{workload}@maxn" if m.empty else f"{workload}@(any pinned clock)")
            continue
        energy = _mean_by_clock(gp, "metrics.energy_j")
        time = _mean_by_clock(gp, "metrics.time_s")
        e_exp = _mean_by_clock(gp, "metrics.energy_expected_j")
        t_exp = _mean_by_clock(gp, "metrics.time_expected_s")
        util = {f: u for f, u in _mean_by_clock(gp, "metrics.gpu_util_pct").items() if f in energy}
        measured.append((energy, time, util))
        if _adaptive(g) and len(energy) >= 2 and set(energy) != set(freqs):
            gaps.append(len(measured) - 1)  # filled below, once the sweep's voltage shape and power prior are known
        r0 = g.iloc[0]
        feats = WorkloadFeatures(
            model_type=str(r0["params.model_type"]), num_layers=int(r0["params.num_layers"]),
            hidden_size=int(r0["params.hidden_size"]), num_params=int(r0["params.num_params"]),
            avg_seq_len=_num(r0["params.avg_seq_len"]), gpu_util_pct=float(m["metrics.gpu_util_pct"].mean()),
            trainable_params=_optional_int(r0.get("params.trainable_params")),  # runs from before it: a full fine-tune
            precision=_present_str(r0.get("params.precision")) or "fp32",
        )
        acc_col = next((c for c in ("metrics.eval_accuracy", "metrics.eval_pearson") if c in g and g[c].notna().any()), None)
        acc = {str(k): float(v) for k, v in g.groupby("params.freq_mhz")[acc_col].mean().items()} if acc_col else {}

        curves.append(WorkloadCurve(workload, str(r0.get("params.split", "train")), feats, energy, time,
                                    float(m["metrics.energy_j"].mean()), float(m["metrics.time_s"].mean()), acc,
                                    e_exp, t_exp, _maxn_mean(m, "metrics.energy_expected_j"), _maxn_mean(m, "metrics.time_expected_s"),
                                    dict(util)))
    repeats = int(pinned.groupby(["_workload", "params.freq_mhz"]).size().median()) if len(pinned) else 1
    if gaps:
        shape = fill_from_curves(measured, freqs, gaps, power_noise(device_profile, repeats))
        log.info("sweep %s: %d adaptive workload(s) filled from their curve fits (voltage shape %.2f, fitted across the sweep)",
                 sweep_id or "?", len(gaps), shape)
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        raise DvfsError(f"sweep {sweep_id or '?'} has {len(missing)} unusable workload(s), missing: {shown}; "
                        "re-run the sweep to measure them")
    partial = [c.workload for c in curves if len(c.energy_j) < len(freqs)]
    if partial:
        log.info("sweep %s: %d workload(s) measured only some clocks; policies are judged among the clocks each has",
                 sweep_id or "?", len(partial))
    return GovernorDataset(curves, freqs, sweep_id, device_profile, simulated, repeats)


def load_sweep_dataset(sweep_id: str | None = None, experiment: str = "dvfs-sweep", *, sweeps_filter: str = "",
                       mix_profiles: bool = False) -> GovernorDataset:
    """The dataset of one sweep or several (`sweep_id` "a,b,..."; or every sweep of the experiment with point runs
    matching the MLflow filter `sweeps_filter`); default the latest sweep of the experiment.

    Several sweeps are one dataset (a fleet's boards, each with its own sweep): a workload measured by several is
    averaged over them, as repeats are, so its sweeps must agree on steps, batch size and precision. Sweeps of
    different device profiles are refused unless `mix_profiles`: one board's clock table is not another's."""
    from dvfs_mlops import tracking
    from dvfs_mlops.runs import find_sweep_ids, latest_sweep_id, sweeps_frame

    c = tracking.check_reachable()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    if sweep_id and sweeps_filter:
        raise DvfsError("give --sweep-id or --sweeps-filter, not both")
    if sweeps_filter:
        try:
            ids = find_sweep_ids(c, [exp.experiment_id], sweeps_filter)
        except Exception as e:  # noqa: BLE001 - MLflow's parser names what is wrong
            raise DvfsError(f"--sweeps-filter {sweeps_filter!r}: {str(e).strip().splitlines()[0][:200]}") from None
        if not ids:
            raise DvfsError(f"no sweep in experiment {experiment!r} has FINISHED points matching {sweeps_filter!r}")
    else:
        ids = [s.strip() for s in (sweep_id or "").split(",") if s.strip()] or [latest_sweep_id(c, experiment)]
    ids = list(dict.fromkeys(ids))
    try:
        df = sweeps_frame([exp.experiment_id], ids)
    except DvfsError as e:
        raise DvfsError(f"{e} in experiment {experiment!r}") from None
    label = ids[0] if len(ids) == 1 else ",".join(ids)
    profiles = sorted({str(p) for p in df["params.device_profile"].dropna()})
    if len(profiles) > 1 and not mix_profiles:
        by = {p: sorted(set(df[df["params.device_profile"] == p][f"tags.{tracking.TAG_SWEEP}"])) for p in profiles}
        shown = "; ".join(f"{p}: {', '.join(v[:4])}" for p, v in by.items())
        raise DvfsError(f"the sweeps mix {len(profiles)} device profiles ({shown}); train one governor per profile "
                        "(pick the sweeps, e.g. --sweeps-filter \"params.device_profile = '...'\"), or pass --mix-profiles")
    if len(ids) > 1:
        _check_comparable(df)
    simulated = bool((df[f"tags.{tracking.TAG_SIMULATED}"].astype(str) == "true").all())
    return dataset_from_frame(df, label, "+".join(profiles), simulated)


def _check_comparable(df: Any) -> None:
    """A workload measured by several sweeps is averaged over them: they must have measured the same job."""
    cols = [c for c in ("params.steps", "params.profile_steps", "params.batch_size", "params.precision") if c in df]
    names = df["params.model"] + "/" + df["params.task"]
    for workload, g in df.groupby(names):
        differ = [c[len("params."):] for c in cols if g[c].astype(str).nunique() > 1]
        if differ:
            from dvfs_mlops import tracking

            sweeps = ", ".join(sorted(set(g[f"tags.{tracking.TAG_SWEEP}"])))
            raise DvfsError(f"workload {workload} was measured with different {', '.join(differ)} by sweeps {sweeps}; "
                            "their energies are not comparable: train on sweeps of the same job definition")


def feature_matrix(curves: Sequence[WorkloadCurve], columns: Sequence[str]) -> list[list[float]]:
    """Numeric features for sklearn (columns from NUMERIC_FEATURES); model_type becomes is_decoder (0/1)."""
    rows = []
    for c in curves:
        values = c.features.numeric_row()
        rows.append([float(values[k]) for k in columns])
    return rows
