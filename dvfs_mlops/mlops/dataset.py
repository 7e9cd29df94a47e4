"""The governor's dataset read from a sweep's MLflow runs (one sweep, or a fleet's several): one `WorkloadCurve` per
workload, the clocks an adaptive sweep did not measure filled from each workload's curve fit.

Every column is named by its declaration (`fields.column`) and every value typed by it (`fields.Field.parse`): the
features come back as `WorkloadFeatures` field by field, and `run_record` reads a whole run back as the `RunRecord`
its writer logged."""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import fields, schema, tracking
from dvfs_mlops.mlops.records import RunRecord
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT
from dvfs_mlops.model.governor.dataset import Curves, GovernorDataset, WorkloadCurve, fill_from_curves
from dvfs_mlops.model.workload import METRIC, WorkloadFeatures

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

MODEL, TASK, FREQ, SPLIT, PROFILE = (fields.column(n) for n in ("model", "task", "freq_mhz", "split", "device_profile"))
ENERGY, TIME, UTIL = (fields.column(n, METRIC) for n in ("energy_j", "time_s", "gpu_util_pct"))
ENERGY_EXPECTED, TIME_EXPECTED = fields.column("energy_expected_j", METRIC), fields.column("time_expected_s", METRIC)
EVAL_METRICS = tuple(fields.column(n, METRIC) for n in ("eval_accuracy", "eval_pearson"))  # a workload's accuracy by clock
# What must agree between sweeps that measured the same workload for their energies to be averaged.
KNOB_COLUMNS = tuple(fields.column(n) for n in ("cpu_freq_mhz", "emc_freq_mhz"))  # a configuration's clocks beside freq_mhz
COMPARABLE = tuple(fields.column(n) for n in ("steps", "profile_steps", "batch_size", "precision")) + tuple(k.column for k in fields.KNOBS)


def _num(v: str | float) -> float:
    return float(v)


def model_task(df: Any) -> Any:
    """Each run's MODEL/TASK; a replayed grid's point has no task: its workload is the model param, the grid's name."""
    if TASK not in df:
        return df[MODEL]
    return (df[MODEL] + "/" + df[TASK]).fillna(df[MODEL])


def features_of(row: pd.Series, gpu_util_pct: float | None) -> WorkloadFeatures:
    """A point run's `WorkloadFeatures` from its params (each parsed as declared; a feature the run predates takes its
    default) and the workload's utilisation at maxn."""
    values = {f.name: f.parse(row.get(f.column)) for f in fields.FEATURES}
    return WorkloadFeatures(**{k: v for k, v in values.items() if v is not None}, gpu_util_pct=gpu_util_pct)


def run_record(params: dict[str, str], metrics: dict[str, float], tags: dict[str, str]) -> RunRecord:
    """A run as MLflow gives it back (params as text, metrics as floats) -> the `RunRecord` its writer logged: each
    declared param and metric typed by its declaration (`fields.Field.parse`), undeclared ones as they are."""
    def typed(name: str, value: str | float, kind: str) -> Any:
        try:
            return fields.field(name, kind).parse(value)
        except KeyError:
            return value

    return RunRecord({k: typed(k, v, "param") for k, v in params.items()},
                     {k: typed(k, v, METRIC) for k, v in metrics.items()}, dict(tags))


def unheld_points(df: pd.DataFrame) -> list[str]:
    """Point keys of pinned runs whose measured clock did not hold (tag dvfs.clock_held=false)."""
    col = f"tags.{schema.TAG_CLOCK_HELD}"
    if col not in df:
        return []
    bad = df[df[col] == "false"]
    key_col = f"tags.{schema.TAG_POINT}"
    return sorted(str(k) for k in (bad[key_col] if key_col in bad else bad["run_id"]))


def warn_unheld_clocks(df: pd.DataFrame, sweep_id: str = "") -> None:
    """Name the points whose clock strayed: their energy belongs to another clock than the label says."""
    bad = unheld_points(df)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        log.warning("sweep %s: %d point(s) did not hold their pinned clock (throttled or capped), their energy is "
                    "labelled with a clock the GPU did not run at: %s", sweep_id or "?", len(bad), shown)


def _mean_by_clock(g: pd.DataFrame, column: str) -> dict[float, float]:
    if column not in g:
        return {}
    v = g.groupby("_f")[column].mean()
    return {float(k): float(x) for k, x in v.items() if not math.isnan(x)}  # drop NaN (a run without the metric)


def _maxn_mean(m: pd.DataFrame, column: str) -> float | None:
    v = float(m[column].mean()) if column in m else math.nan
    return None if math.isnan(v) else v


def is_replayed(dataset: Any) -> bool:
    """The sweep of a dataset (`GovernorDataset`, `SweepPoints`, `joint_dataset.JointDataset`: anything with its
    `board`) played a measured grid (its board is a replay device's): what it says is REPLAYED."""
    board = getattr(dataset, "board", None)
    return board is not None and board.backend == "replay"


def _replayed(g: Any) -> bool:
    """The workload's points were looked up in a measured grid (`--device replay`)."""
    col = f"tags.{schema.TAG_DEVICE}"
    return col in g and bool((g[col] == "replay").all())


def _adaptive(g: pd.DataFrame) -> bool:
    """An adaptive sweep's workload (sweep/adaptive.py): its unmeasured clocks are left to the curve model."""
    col = f"tags.{schema.TAG_STRATEGY}"
    return col in g and bool((g[col] == "adaptive").all())


def dataset_from_frame(df: pd.DataFrame, sweep_id: str = "", device_profile: str = "", simulated: bool = True,
                       board: Board | None = None) -> GovernorDataset:
    """Rows of `mlflow.search_runs` (params.*, metrics.*, tags.*) -> a dataset, on the sweep's `board` (its record;
    None: a board nothing is known of).

    Partial sweeps are valid: a workload needs maxn (its gpu_util_pct and the slowdown reference) and at least
    one pinned clock; clocks it lacks are simply not among its choices. Unusable workloads are named."""
    if not len(df):
        raise DvfsError(f"sweep {sweep_id or '?'} has no FINISHED point runs")
    df = df.copy()
    named = f"tags.{schema.TAG_WORKLOAD}"  # MODEL/TASK plus the variant (+lora-r8a16+bf16) where not full fp32
    df["_workload"] = model_task(df)
    if named in df:
        df["_workload"] = df[named].fillna(df["_workload"])
    warn_unheld_clocks(df, sweep_id)
    pinned = df[df[FREQ] != "maxn"]
    freqs = sorted({_num(f) for f in pinned[FREQ]})
    curves: list[WorkloadCurve] = []
    missing: list[str] = []
    measured: list[Curves] = []
    gaps: list[int] = []  # adaptive workloads among `measured`
    no_util: list[str] = []  # replayed workloads without a GPU utilisation
    capped_col = f"tags.{schema.TAG_CAP_AT_START}"
    for workload, g in df.groupby("_workload", sort=True):
        gp = g[g[FREQ] != "maxn"].assign(_f=lambda x: x[FREQ].map(_num))
        m = g[g[FREQ] == "maxn"]
        if capped_col in m:  # maxn under a cap found at the start is another clock than the baseline: not used as it
            m = m[m[capped_col].isna()]
        if m.empty or gp.empty:
            capped = capped_col in g and g[(g[FREQ] == "maxn") & g[capped_col].notna()].shape[0] > 0
            missing.append(f"{workload}@maxn" + (" (capped at the start)" if capped else "") if m.empty
                           else f"{workload}@(any pinned clock)")
            continue
        energy = _mean_by_clock(gp, ENERGY)
        time = _mean_by_clock(gp, TIME)
        e_exp = _mean_by_clock(gp, ENERGY_EXPECTED)
        t_exp = _mean_by_clock(gp, TIME_EXPECTED)
        util = {f: u for f, u in _mean_by_clock(gp, UTIL).items() if f in energy}
        measured.append((energy, time, util))
        if _adaptive(g) and len(energy) >= 2 and set(energy) != set(freqs):
            gaps.append(len(measured) - 1)  # filled below, once the sweep's voltage shape and power prior are known
        r0 = g.iloc[0]
        maxn_util = _maxn_mean(m, UTIL)
        if maxn_util is None and _replayed(g):  # a grid that does not give the utilisation: the governor cannot decide on it
            no_util.append(str(workload))
        feats = features_of(r0, math.nan if maxn_util is None else maxn_util)
        acc_col = next((c for c in EVAL_METRICS if c in g and g[c].notna().any()), None)
        acc = {str(k): float(v) for k, v in g.groupby(FREQ)[acc_col].mean().items()} if acc_col else {}

        curves.append(WorkloadCurve(workload, str(r0.get(SPLIT, "train")), feats, energy, time,
                                    float(m[ENERGY].mean()), float(m[TIME].mean()), acc,
                                    e_exp, t_exp, _maxn_mean(m, ENERGY_EXPECTED), _maxn_mean(m, TIME_EXPECTED),
                                    dict(util)))
    if no_util:
        raise DvfsError(f"sweep {sweep_id or '?'} replays a grid without the GPU utilisation the governor decides on "
                        f"({', '.join(no_util[:6])}{' ...' if len(no_util) > 6 else ''}); add a gpu_util_pct column (% at the top "
                        "setting) to the grid and sweep it again")
    repeats = int(pinned.groupby(["_workload", FREQ]).size().median()) if len(pinned) else 1
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


@dataclasses.dataclass(frozen=True)
class SweepPoints:
    """The FINISHED point runs of one sweep or several, checked to make one dataset: what `load_sweep_dataset` (the
    GPU-only governor's curves) and `joint_dataset.load_joint_dataset` (a configuration table) read from.

    Attributes:
        frame: the point runs (`mlflow.search_runs`' columns: params.*, metrics.*, tags.*).
        label: the sweep id, or "a,b,..." for several.
        device_profile: their device profile(s), "+"-joined.
        simulated: every point was measured on the twin.
        board: the sweeps' board record (`_one_board`).
    """

    frame: pd.DataFrame
    label: str
    device_profile: str
    simulated: bool
    board: Board

    @property
    def replayed(self) -> bool:
        """The sweep played a measured grid (its board is a replay device's): what it says is REPLAYED."""
        return is_replayed(self)

    @property
    def joint(self) -> bool:
        """A sweep of configurations (`--knobs gpu,cpu...`): its points pinned a CPU or memory clock with the GPU's."""
        return any(k in self.frame and self.frame[k].notna().any() for k in KNOB_COLUMNS)


def read_sweep_points(sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, *, sweeps_filter: str = "",
                      mix_profiles: bool = False, split: str = "train", say: Callable[[str], None] | None = None) -> SweepPoints:
    """The point runs of one sweep or several (`sweep_id` "a,b,..."; or every sweep of the experiment with point runs
    matching the MLflow filter `sweeps_filter`); default the newest sweep of the experiment with workloads of `split`
    (`queries.newest_sweep`: never a calibration's), said through `say`.

    Several sweeps are one dataset (a fleet's boards, each with its own sweep): a workload measured by several is
    averaged over them, as repeats are, so its sweeps must agree on steps, batch size and precision. Sweeps of
    different device profiles are refused unless `mix_profiles`: one board's clock table is not another's.

    Raises:
        DvfsError: no such experiment or sweep, a bad filter, mixed profiles or power modes, incomparable jobs.
    """
    from dvfs_mlops.mlops.queries import find_sweep_ids, newest_sweep, sweeps_frame

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
        ids = [s.strip() for s in (sweep_id or "").split(",") if s.strip()]
        if not ids:
            ids = [newest_sweep(c, experiment, split=split)]
            (say or log.info)(f"sweep {ids[0]}: the newest in {experiment} with {split if split != 'all' else 'finished'} "
                              "workloads (no --sweep-id given)")
    ids = list(dict.fromkeys(ids))
    try:
        df = sweeps_frame([exp.experiment_id], ids)
    except DvfsError as e:
        raise DvfsError(f"{e} in experiment {experiment!r}") from None
    label = ids[0] if len(ids) == 1 else ",".join(ids)
    profiles = sorted({str(p) for p in df[PROFILE].dropna()})
    if len(profiles) > 1 and not mix_profiles:
        by = {p: sorted(set(df[df[PROFILE] == p][f"tags.{schema.TAG_SWEEP}"])) for p in profiles}
        shown = "; ".join(f"{p}: {', '.join(v[:4])}" for p, v in by.items())
        raise DvfsError(f"the sweeps mix {len(profiles)} device profiles ({shown}); train one governor per profile "
                        "(pick the sweeps, e.g. --sweeps-filter \"params.device_profile = '...'\"), or pass --mix-profiles")
    _check_one_power_mode(df, label)
    if len(ids) > 1:
        _check_comparable(df)
    simulated = bool((df[f"tags.{schema.TAG_SIMULATED}"].astype(str) == "true").all())
    return SweepPoints(df, label, "+".join(profiles), simulated, _one_board(c, [exp.experiment_id], ids, df))


def load_sweep_dataset(sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, *, sweeps_filter: str = "",
                       mix_profiles: bool = False, split: str = "train", say: Callable[[str], None] | None = None) -> GovernorDataset:
    """The GPU-only governor's dataset of one sweep or several (`read_sweep_points`, the same arguments): one
    `WorkloadCurve` per workload (`dataset_from_frame`)."""
    points = read_sweep_points(sweep_id, experiment, sweeps_filter=sweeps_filter, mix_profiles=mix_profiles, split=split, say=say)
    return dataset_from_frame(points.frame, points.label, points.device_profile, points.simulated, points.board)


def _one_board(c: MlflowClient, experiment_ids: list[str], sweep_ids: list[str], df: pd.DataFrame) -> Board:
    """The board of the sweeps: their common record, or, where a fleet's sweeps ran on boards whose curves or noise
    differ, an assumed board on their clocks (each fit then estimates its own)."""
    from dvfs_mlops.hw.board import legacy_board
    from dvfs_mlops.mlops.queries import sweep_board

    sweep_col = df[f"tags.{schema.TAG_SWEEP}"]
    boards = [sweep_board(c, experiment_ids, sid, df[sweep_col == sid]) for sid in sweep_ids]
    same = {(b.frequencies_mhz, b.voltage_shape, b.voltage_shape_known, b.noise_time, b.noise_power) for b in boards}
    if len(same) == 1:
        return boards[0]
    clocks = sorted({float(f) for f in df[FREQ] if f != "maxn"})
    return legacy_board("+".join(sorted({b.profile for b in boards})), clocks)


def _check_one_power_mode(df: Any, label: str) -> None:
    """A governor does not mix power modes: the same clock gives other throughput under another mode (its TPCs
    power-gated, its caps). Points of several modes (tag dvfs.power_mode; absent: MAXN or no mode) are refused.

    Raises:
        DvfsError: the points were measured under more than one power mode (one line naming them).
    """
    col = f"tags.{schema.TAG_POWER_MODE}"
    if col not in df:
        return
    modes = sorted({str(m) if isinstance(m, str) and m else "MAXN (or no mode)" for m in df[col]})
    if len(modes) > 1:
        raise DvfsError(f"sweep(s) {label} mix {len(modes)} power modes ({'; '.join(modes)}); a governor learns one mode: pick "
                        f"the sweeps of one (e.g. --sweeps-filter \"tags.`{schema.TAG_POWER_MODE}` = '...'\") and train one "
                        "governor per mode")


def _check_comparable(df: pd.DataFrame) -> None:
    """A workload measured by several sweeps is averaged over them: they must have measured the same job."""
    cols = [c for c in COMPARABLE if c in df]
    for workload, g in df.groupby(model_task(df)):
        differ = [c[len("params."):] for c in cols if g[c].astype(str).nunique() > 1]
        if differ:
            sweeps = ", ".join(sorted(set(g[f"tags.{schema.TAG_SWEEP}"])))
            raise DvfsError(f"workload {workload} was measured with different {', '.join(differ)} by sweeps {sweeps}; "
                            "their energies are not comparable: train on sweeps of the same job definition")
