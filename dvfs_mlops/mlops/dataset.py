"""The governor's dataset read from a sweep's MLflow runs (one sweep, or a fleet's several): one `WorkloadCurve` per
workload, the clocks an adaptive sweep did not measure filled from each workload's curve fit."""
from __future__ import annotations

import logging
import math
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT
from dvfs_mlops.model.governor.dataset import Curves, GovernorDataset, WorkloadCurve, fill_from_curves
from dvfs_mlops.model.workload import WorkloadFeatures

log = logging.getLogger(__name__)


def _num(v: Any) -> float:
    return float(v)


def unheld_points(df: Any) -> list[str]:
    """Point keys of pinned runs whose measured clock did not hold (tag dvfs.clock_held=false)."""
    col = f"tags.{schema.TAG_CLOCK_HELD}"
    if col not in df:
        return []
    bad = df[df[col] == "false"]
    key_col = f"tags.{schema.TAG_POINT}"
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
    col = f"tags.{schema.TAG_STRATEGY}"
    return col in g and bool((g[col] == "adaptive").all())


def dataset_from_frame(df: Any, sweep_id: str = "", device_profile: str = "", simulated: bool = True,
                       board: Board | None = None) -> GovernorDataset:
    """Rows of `mlflow.search_runs` (params.*, metrics.*, tags.*) -> a dataset, on the sweep's `board` (its record;
    None: a board nothing is known of).

    Partial sweeps are valid: a workload needs maxn (its gpu_util_pct and the slowdown reference) and at least
    one pinned clock; clocks it lacks are simply not among its choices. Unusable workloads are named."""
    if not len(df):
        raise DvfsError(f"sweep {sweep_id or '?'} has no FINISHED point runs")
    df = df.copy()
    named = f"tags.{schema.TAG_WORKLOAD}"  # MODEL/TASK plus the variant (+lora-r8a16+bf16) where not full fp32
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
        shape = fill_from_curves(measured, freqs, gaps, board, repeats)
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
    return GovernorDataset(curves, freqs, sweep_id, device_profile, simulated, repeats, board)


def load_sweep_dataset(sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, *, sweeps_filter: str = "",
                       mix_profiles: bool = False) -> GovernorDataset:
    """The dataset of one sweep or several (`sweep_id` "a,b,..."; or every sweep of the experiment with point runs
    matching the MLflow filter `sweeps_filter`); default the latest sweep of the experiment.

    Several sweeps are one dataset (a fleet's boards, each with its own sweep): a workload measured by several is
    averaged over them, as repeats are, so its sweeps must agree on steps, batch size and precision. Sweeps of
    different device profiles are refused unless `mix_profiles`: one board's clock table is not another's."""
    from dvfs_mlops.mlops.queries import find_sweep_ids, latest_sweep_id, sweeps_frame

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
        by = {p: sorted(set(df[df["params.device_profile"] == p][f"tags.{schema.TAG_SWEEP}"])) for p in profiles}
        shown = "; ".join(f"{p}: {', '.join(v[:4])}" for p, v in by.items())
        raise DvfsError(f"the sweeps mix {len(profiles)} device profiles ({shown}); train one governor per profile "
                        "(pick the sweeps, e.g. --sweeps-filter \"params.device_profile = '...'\"), or pass --mix-profiles")
    if len(ids) > 1:
        _check_comparable(df)
    simulated = bool((df[f"tags.{schema.TAG_SIMULATED}"].astype(str) == "true").all())
    return dataset_from_frame(df, label, "+".join(profiles), simulated, _one_board(c, [exp.experiment_id], ids, df))


def _one_board(c: Any, experiment_ids: list[str], sweep_ids: list[str], df: Any) -> Board:
    """The board of the sweeps: their common record, or, where a fleet's sweeps ran on boards whose curves or noise
    differ, an assumed board on their clocks (each fit then estimates its own)."""
    from dvfs_mlops.hw.board import legacy_board
    from dvfs_mlops.mlops.queries import sweep_board

    sweep_col = df[f"tags.{schema.TAG_SWEEP}"]
    boards = [sweep_board(c, experiment_ids, sid, df[sweep_col == sid]) for sid in sweep_ids]
    same = {(b.frequencies_mhz, b.voltage_shape, b.voltage_shape_known, b.noise_time, b.noise_power) for b in boards}
    if len(same) == 1:
        return boards[0]
    clocks = sorted({float(f) for f in df["params.freq_mhz"] if f != "maxn"})
    return legacy_board("+".join(sorted({b.profile for b in boards})), clocks)


def _check_comparable(df: Any) -> None:
    """A workload measured by several sweeps is averaged over them: they must have measured the same job."""
    cols = [c for c in ("params.steps", "params.profile_steps", "params.batch_size", "params.precision") if c in df]
    names = df["params.model"] + "/" + df["params.task"]
    for workload, g in df.groupby(names):
        differ = [c[len("params."):] for c in cols if g[c].astype(str).nunique() > 1]
        if differ:
            sweeps = ", ".join(sorted(set(g[f"tags.{schema.TAG_SWEEP}"])))
            raise DvfsError(f"workload {workload} was measured with different {', '.join(differ)} by sweeps {sweeps}; "
                            "their energies are not comparable: train on sweeps of the same job definition")
