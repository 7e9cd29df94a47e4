"""`dvfs-mlops twin fit`: measured points (a sweep's runs, or a CSV) -> a fitted twin profile YAML.

A sweep's point is rebuilt the way the sweep ran it: the same data plan (model, task, data
source, seed, sizes from the sweep's definition) gives the padded length of every step, so each
point is charged exactly the step traces it ran. Its measured time is `time_s` and its CPU + GPU
power `energy_j / time_s`; where the run's params name its CPU and memory clocks (`cpu_mhz`,
`emc_mhz`) the point is at that configuration. Unpinned (maxn, observe) points and points whose
clock did not hold are left out.

A CSV is a measured grid in the replay format (`hw/replay.py`): `workload` (MODEL/TASK: a model preset and a GLUE
task), `gpu_mhz` (MHz), `time_s` (s) and `energy_j` (J, CPU + GPU) of the SAME work: `steps` training steps (default
1, i.e. both per step) of `batch_size` (default 16) at padded length `seq_len` (default: the task's mean tokenised
length), `dtype` float32 unless given; optional `cpu_mhz`/`emc_mhz` (every row is a point at its configuration: rows
below the CPU table's top fit how much of the host's time follows the CPU clock, `cpu_bound_share`), `power_w`,
`repeat` (every repeat is a point) and the governor's feature columns (not read here). The profile is named
`fit-<grid name>` (the file's stem: the board it was measured on). A grid whose GPU, CPU and EMC clocks are all clocks of
the base profile's tables is that board, measured: the profile keeps the base's family and tables. Any other grid is
another board: the profile's family is the grid's name and its tables the grid's clocks (a domain the grid does not
name keeps the base's table).

A fit whose mean energy or power error is above the unfitted base's, or above `MAX_FIT_ERROR`, says more about the
points (time and energy of different work, another kind of board) than about the board: it is not written without
`force`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.twin.fit import FitPoint, FitResult, fit_profile
from dvfs_mlops.hw.twin.params import OrinTwinParams
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.app.devices import DeviceChoice

log = logging.getLogger(__name__)

# The columns a twin-fit CSV may carry per row beside the replay format's: what the twin needs to rebuild each row's steps.
CSV_ROW_COLUMNS = ("steps", "batch_size", "seq_len", "dtype")
MAX_FIT_ERROR = 0.10  # a fit whose mean energy or power error is above this is not written without --force


@dataclasses.dataclass(frozen=True)
class TwinFitOutcome:
    """A fitted twin profile: the fit, where its YAML was written, and what it was fitted to."""

    result: FitResult
    path: Path
    source: str  # "sweep <id>" or the CSV's path
    simulated_input: bool  # the measured points came from the twin itself

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "path": str(self.path), "source": self.source, "simulated_input": self.simulated_input,
                "simulated": True}  # what the profile drives is the twin

    def lines(self) -> list[str]:
        """The fit as `dvfs-mlops twin fit` prints it: errors of the fitted and the base profile, the fitted
        constants, and the file written."""
        r, base = self.result, self.result.base
        label = " (SIMULATED)" if self.simulated_input else ""
        lines = [f"twin profile {r.params.profile}: fitted {base.profile} to {r.n_points} points of {r.n_workloads} workloads{label}",
                 f"{'quantity':<9} {'mean err':>9} {'max err':>9}   {'base mean':>9} {'base max':>9}"]
        for q, e in r.errors.items():
            b = r.errors_before[q]
            lines.append(f"{q:<9} {100 * e.mean:8.2f}% {100 * e.max:8.2f}%   {100 * b.mean:8.2f}% {100 * b.max:8.2f}%")
        if r.errors_expected is not None:
            lines.append("against the points' noise-free values (SIMULATED): "
                         + ", ".join(f"{q} {100 * e.mean:.2f}% mean / {100 * e.max:.2f}% max" for q, e in r.errors_expected.items()))
        lines += [f"  {k:<24} {getattr(r.params, k):.6g}  (was {getattr(base, k):.6g})" for k in r.fitted]
        lines.append(f"wrote {self.path}; use it with --twin-params {self.path}")
        return lines


def fit_twin_command(twin: DeviceChoice, sweep_id: str = "", experiment: str = SWEEP_EXPERIMENT, csv_path: str | None = None,
                     name: str = "", out: str = "", say: Callable[[str], None] = log.info, force: bool = False) -> TwinFitOutcome:
    """`dvfs-mlops twin fit`: fit the profile that `twin`'s --twin-profile/--twin-params choose (sim-orin by default).

    Args:
        twin: the base profile's choice.
        sweep_id: fit to this sweep's measured points ('' none: `csv_path`).
        experiment: where the sweep's runs are.
        csv_path: or fit to a CSV of measured points.
        name: the fitted profile's name ('': fit-<sweep id or CSV name>).
        out: where to write the YAML ('': <name>.yaml here).
        say: where progress lines go.
        force: write the profile even where the fit is worse than the base's or above `MAX_FIT_ERROR`.

    Returns:
        The `TwinFitOutcome`.

    Raises:
        DvfsError: an unknown base profile, neither or both of a sweep and a CSV, unusable points, a bad fit without
            `force` (nothing written), an unwritable file.
    """
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    base = load_twin_params(twin.twin_profile, twin.twin_params)
    return fit_twin(base, sweep_id=sweep_id or None, experiment=experiment, csv_path=csv_path, name=name or None, out=out or None,
                    say=say, force=force)


def fit_twin(base: OrinTwinParams, *, sweep_id: str | None = None, experiment: str = SWEEP_EXPERIMENT, csv_path: str | None = None,
             name: str | None = None, out: str | None = None, say: Callable[[str], None] = log.info, force: bool = False) -> TwinFitOutcome:
    """Fit `base`'s timing and power constants to the points; write the profile YAML where the fit is good (or `force`);
    return the fit and its errors.

    Raises:
        DvfsError: neither or both of a sweep and a CSV, unusable points, a bad fit without `force` (`check_fit`: nothing
            written), an unwritable file.
    """
    if bool(sweep_id) == bool(csv_path):
        raise DvfsError("give the measured points as either --sweep-id ID or --csv FILE (one of them)")
    if csv_path:
        grid = csv_points(csv_path)
        points, simulated, base = grid.points, False, grid.board(base)
        source, default_name = csv_path, f"fit-{grid.name}"
    else:
        assert sweep_id is not None
        points, simulated = points_from_sweep(sweep_id, experiment, say)
        source, default_name = f"sweep {sweep_id}", f"fit-{sweep_id}"
    name = name or default_name
    say(f"fitting {base.profile} to {len(points)} measured points of {len({p.workload for p in points})} workloads ({source})")
    result = fit_profile(points, base, name)
    if not force:
        check_fit(result)
    path = Path(out or f"{name}.yaml")
    write_profile(result, path, source, simulated)
    return TwinFitOutcome(result, path, source, simulated)


def check_fit(result: FitResult) -> None:
    """A fit is kept where its mean energy and power errors are at most the unfitted base's and at most `MAX_FIT_ERROR`.

    Raises:
        DvfsError: the fit is worse (one line with the errors, fitted and base).
    """
    bad = [q for q in ("energy", "power")
           if result.errors[q].mean > result.errors_before[q].mean or result.errors[q].mean > MAX_FIT_ERROR]
    if not bad:
        return
    said = ", ".join(f"{q} {100 * result.errors[q].mean:.1f} % (base {100 * result.errors_before[q].mean:.1f} %)" for q in ("energy", "power"))
    raise DvfsError(f"the fitted profile {result.params.profile} is not written: mean error {said}; a fit is kept where both are at "
                    f"most the base's and at most {100 * MAX_FIT_ERROR:g} %. Check that time_s and energy_j are of the same `steps` "
                    "training steps (default 1), or pass --force to write it anyway")


def write_profile(result: FitResult, path: Path, source: str, simulated_input: bool) -> None:
    import yaml

    err = ", ".join(f"{q} {100 * e.mean:.2f}% mean / {100 * e.max:.2f}% max" for q, e in result.errors.items())
    header = (f"# Twin profile {result.params.profile}: written by `dvfs-mlops twin fit` from {source}"
              f"{' (SIMULATED points)' if simulated_input else ''},\n"
              f"# {result.n_points} points of {result.n_workloads} workloads, starting from {result.base.profile}; "
              f"board family {result.params.family}.\n"
              f"# Fitted: {', '.join(result.fitted)}; every other constant is {result.base.profile}'s.\n"
              f"# Relative error of the fit: {err}.\n# Load it with --twin-params {path.name}\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + yaml.safe_dump(result.params.to_dict(), sort_keys=False))
    except OSError as e:
        raise DvfsError(f"cannot write the fitted profile to {path}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class CsvPoints:
    """A measured grid read for a twin fit: its points, and what it says about the board.

    Attributes:
        name: the grid's name (the file's stem: the board it was measured on).
        points: one `FitPoint` per row (every repeat), at the row's configuration.
        frequencies_mhz: the grid's GPU clocks, ascending.
        cpu_frequencies_mhz: the grid's CPU clocks, ascending; () where it has no `cpu_mhz` column.
        emc_frequencies_mhz: the grid's memory (EMC) clocks, ascending; () where it has no `emc_mhz` column.
    """

    name: str
    points: list[FitPoint]
    frequencies_mhz: tuple[float, ...]
    cpu_frequencies_mhz: tuple[float, ...] = ()
    emc_frequencies_mhz: tuple[float, ...] = ()

    def board(self, base: OrinTwinParams) -> OrinTwinParams:
        """`base` as the board the grid was measured on: itself where every clock of the grid is one of its tables',
        else another board, whose family is the grid's name and whose tables are the grid's clocks (a domain the grid
        does not name keeps the base's table)."""
        tables: dict[str, Any] = {"frequencies_mhz": self.frequencies_mhz, "cpu_frequencies_mhz": self.cpu_frequencies_mhz,
                                  "emc_frequencies_mhz": self.emc_frequencies_mhz}
        if all(_within_table(clocks, getattr(base, field)) for field, clocks in tables.items()):
            return base
        return dataclasses.replace(base, family=self.name, **{field: clocks for field, clocks in tables.items() if clocks})


def _within_table(clocks: tuple[float, ...], table: tuple[float, ...]) -> bool:
    """Every clock is one of the table's (to within the 0.5 MHz a `--freq` resolves)."""
    return all(any(math.isclose(f, t, abs_tol=0.5) for t in table) for f in clocks)


def csv_points(csv_path: str) -> CsvPoints:
    """The fit points of a measured grid in the replay format (module doc).

    Raises:
        DvfsError: the file is not a valid grid (`hw.replay.read_grid`), a workload is not MODEL/TASK, or a per-row
            column is not a positive number.
    """
    from dvfs_mlops.hw.replay import read_grid
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.workloads.features import classifier_config
    from dvfs_mlops.job.workloads.tasks import get_task
    from dvfs_mlops.job.workloads.zoo import resolve_model
    from dvfs_mlops.model.workload import FEATURE_COLUMNS

    grid = read_grid(csv_path, workload_columns=FEATURE_COLUMNS, row_columns=CSV_ROW_COLUMNS)
    traces = TraceCache()
    points = []
    for row in grid.rows:
        where = f"{csv_path} line {row.line}"
        model, _, task_name = row.workload.partition("/")
        if not model or not task_name:
            raise DvfsError(f"{where}: the twin fits workloads it can trace, MODEL/TASK (a model preset and a GLUE task, e.g. "
                            f"bert-base/sst2), got {row.workload!r}; a grid of other workloads replays (--device replay) but "
                            "cannot fit the twin")
        spec, task = resolve_model(model, None), get_task(task_name)
        steps = int(_number(row.extra, "steps", where, 1))
        batch = int(_number(row.extra, "batch_size", where, 16))
        seq = int(_number(row.extra, "seq_len", where, task.mean_tokens))
        dtype = row.extra.get("dtype", "float32")
        config = classifier_config(spec, task.num_labels, None, task.kind) if task.causal_lm else spec.config
        trace = traces.get(config, batch, seq, dtype, task.num_labels, kind=task.kind)
        points.append(FitPoint(f"{spec.name}/{task.name}", row.setting.gpu_mhz, ((trace, steps),), row.time_s, row.power_w,
                               cpu_mhz=row.setting.cpu_mhz, emc_mhz=row.setting.emc_mhz))
    return CsvPoints(grid.name, points, grid.gpu_mhz, grid.cpu_mhz, grid.emc_mhz)


def _number(row: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    raw = (row.get(key) or "").strip()
    if not raw and default is not None:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise DvfsError(f"{where}: {key} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise DvfsError(f"{where}: {key} must be a positive number, got {raw!r}")
    return value


def points_from_sweep(sweep_id: str, experiment: str, say: Callable[[str], None]) -> tuple[list[FitPoint], bool]:
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.queries import sweep_frame

    c = tracking.check_reachable()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise DvfsError(f"experiment {experiment!r} does not exist; run a sweep first (dvfs-mlops sweep)")
    df = sweep_frame([exp.experiment_id], sweep_id)
    if not len(df):
        raise DvfsError(f"sweep {sweep_id!r} has no finished points in experiment {experiment!r}")
    replayed = f"tags.{schema.TAG_DEVICE}"
    if replayed in df and (df[replayed] == "replay").any():  # its points are the grid's rows, not jobs the twin can trace
        name = df[f"tags.{schema.TAG_TRACE_NAME}"].dropna().iloc[0] if f"tags.{schema.TAG_TRACE_NAME}" in df else "a grid"
        raise DvfsError(f"sweep {sweep_id} replays a measured grid ({name}); fit the twin on the grid itself: "
                        "dvfs-mlops twin fit --csv FILE (its workloads MODEL/TASK, as the twin traces them)")
    pinned = df[df["params.freq_mhz"] != "maxn"]
    for tag in (schema.TAG_CLOCK_HELD, schema.TAG_OBSERVE):
        column = f"tags.{tag}"
        if column in pinned:
            pinned = pinned[pinned[column].fillna("") != ("false" if tag == schema.TAG_CLOCK_HELD else "true")]
    definition = _sweep_definition(c, df)
    column = f"tags.{schema.TAG_SIMULATED}"
    simulated = column in df and bool((df[column] == "true").all())
    points: list[FitPoint] = []
    for (model, task), rows in pinned.groupby(["params.model", "params.task"]):
        first = rows.iloc[0]
        steps = _plan(model, task, first, definition)
        for _, r in rows.iterrows():
            time_s, energy = float(r["metrics.time_s"]), float(r["metrics.energy_j"])
            points.append(FitPoint(f"{model}/{task}", float(r["params.freq_mhz"]), steps, time_s, energy / time_s,
                                   _present(r.get("metrics.time_expected_s")), _present(r.get("metrics.energy_expected_j")),
                                   _clock(r.get("params.cpu_mhz"), "cpu_mhz"), _clock(r.get("params.emc_mhz"), "emc_mhz")))
    say(f"sweep {sweep_id}: {len(points)} pinned points of {pinned['params.model'].nunique()} models"
        + (" (SIMULATED)" if simulated else ""))
    return points, simulated


def _sweep_definition(c: MlflowClient, df: pd.DataFrame) -> dict[str, Any]:
    """The sweep's data sizes: its parent's `sweep_definition`, or the preset `mlflow run` was given."""
    from dvfs_mlops.mlops.sweep.spec import PRESETS

    parent_id = df[f"tags.{schema.TAG_PARENT}"].dropna().iloc[0] if f"tags.{schema.TAG_PARENT}" in df else None
    params = c.get_run(parent_id).data.params if parent_id else {}
    if "sweep_definition" in params:
        try:
            return dict(json.loads(params["sweep_definition"]))
        except ValueError:
            pass
    preset = PRESETS.get(params.get("preset", ""))
    if preset is None:
        raise DvfsError("cannot tell the sweep's data sizes (its parent run has no sweep_definition or preset); fit from a CSV instead")
    data_dir = (params.get("data_dir") or "").strip("'\"")  # `mlflow run` logs an empty value as ''
    return {"train_size": preset.train_size, "dev_size": preset.dev_size, "data_dir": data_dir or None}


def _plan(model: str, task: str, run: pd.Series, definition: dict[str, Any]) -> tuple[Any, ...]:
    """(trace, count) of every padded length the point's steps ran, as the sweep planned them."""
    from dvfs_mlops.job.finetune import PRECISIONS, plan_batches
    from dvfs_mlops.job.workloads.adapters import peft_from_params
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.job.workloads.tokenizer import padded_length

    seed, batch = int(run["params.seed"]), int(run["params.batch_size"])
    steps = int(run["params.steps"]) or int(_present(run.get("params.profile_steps")) or definition.get("profile_steps") or 0)
    # a config-file or pretrained model: where the sweep read it (runs before these params: a preset)
    config_path, pretrained = _present(run.get("params.model_config")) or None, _present(run.get("params.pretrained")) or None
    prepared = prepare_workload(model, task, model_config_path=config_path, pretrained=pretrained,
                                data_source=str(run["params.data_source"]), data_dir=definition.get("data_dir"),
                                seed=seed, train_size=int(definition["train_size"]), dev_size=int(definition.get("dev_size", 256)),
                                peft=peft_from_params({k[len("params."):]: v for k, v in run.items()
                                                       if k.startswith("params.") and _present(v) is not None}))
    lengths = Counter(padded_length([prepared.train_lengths[i] for i in b]) for b in plan_batches(prepared.n_train, steps, batch, seed))
    trace_for = prepared.trace_provider(batch, PRECISIONS[str(_present(run.get("params.precision")) or "fp32")])
    return tuple((trace_for(n), k) for n, k in sorted(lengths.items()))


def _clock(value: str | float | None, name: str) -> float | None:
    """A run's CPU or EMC clock param (`name`) in MHz; None where it was not logged (a GPU-only point: the tables' tops).

    Raises:
        DvfsError: the param is not a number.
    """
    value = _present(value)
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        raise DvfsError(f"a point's {name} param is {value!r}, not a clock in MHz; fit from a CSV of the sweep instead") from None


def _present(value: object) -> Any:
    """A frame cell, None where it is missing (NaN)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
