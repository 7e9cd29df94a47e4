"""`dvfs-mlops curve fit`: one workload's curve model, from a CSV of measured clocks or from a sweep's runs.

From a sweep the fit is the sweep's own (`power_prior.sweep_fits`, as the adaptive sweep's `predicted.csv`): every
workload's clocks with their repeats averaged, the sweep's board (its record on the parent run: voltage shape, table
top, noise), the noise of a mean of its repeats, and the power prior of all the other workloads. From a CSV nothing
else of the board is known: the Orin's voltage shape (or `--voltage-shape`), the CSV's highest clock as the top.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT
from dvfs_mlops.model.curve import CurveFit, CurvePoint, fit_curve, read_measurements_csv, select_clocks


@dataclasses.dataclass(frozen=True)
class CurveFitRequest:
    """Where the points are (a CSV, or a sweep's workload: '' sweep id, the newest sweep that has it), which clocks to fit
    on, the voltage shape to assume."""

    file: str = ""
    sweep_id: str = ""
    workload: str = ""
    experiment: str = SWEEP_EXPERIMENT
    clocks: str = ""
    voltage_shape: float | None = None


@dataclasses.dataclass(frozen=True)
class CurveFitOutcome:
    """The fit, its predictions at every clock of the table, and the clocks it was fitted on."""

    fit: CurveFit
    predicted: list[CurvePoint]
    fitted_on: list[float]

    @property
    def best(self) -> CurvePoint:
        return min(self.predicted, key=lambda p: p.energy_j)

    def to_json(self) -> dict[str, Any]:
        """The `--json` object: points, optimal_freq_mhz, fitted_on_mhz, params, power_prior."""
        f = self.fit
        return {
            "points": [{"freq_mhz": p.freq_mhz, "time_s": p.time_s, "power_w": p.power_w, "energy_j": p.energy_j,
                        "energy_std_j": p.energy_std_j, "measured": p.freq_mhz in self.fitted_on} for p in self.predicted],
            "optimal_freq_mhz": self.best.freq_mhz, "fitted_on_mhz": self.fitted_on,
            "params": {"a_s": f.a, "b_s_ghz": f.b, "c_w": f.c, "d_w_per_ghz": f.d, "voltage_shape": f.voltage_shape},
            "power_prior": None if f.prior is None else json.loads(f.prior.to_json()),
        }

    def lines(self) -> list[str]:
        """The fit as the command prints it."""
        f = self.fit
        load = "V(f)^2 f[GHz]" if f.prior is None else f"V(f)^2 f[GHz] ({f.prior.idle_share:g} + {1 - f.prior.idle_share:g} u(f))"
        out = [(f"fitted on {', '.join(f'{x:g}' for x in self.fitted_on)} MHz: time = {f.a:.4g} + {f.b:.4g}/f[GHz] s, "
               f"power = {f.c:.4g} + {f.d:.4g} {load} W")]
        if f.prior is not None:
            out.append(f"power prior from {f.prior.workloads} other workloads of the sweep: log dynamic/static ratio "
                       f"{f.prior.log_ratio_mean:.3f} +- {f.prior.log_ratio_sd:.3f} (as the adaptive sweep's predicted.csv)")
        out.append(f"{'freq_mhz':>9} {'time_s':>10} {'power_w':>9} {'energy_j':>10} {'+/- J':>8}")
        for p in self.predicted:
            sd = f"{p.energy_std_j:8.3g}" if p.energy_std_j is not None else "     n/a"
            mark = "  (fitted on)" if p.freq_mhz in self.fitted_on else ""
            out.append(f"{p.freq_mhz:9g} {p.time_s:10.4g} {p.power_w:9.4g} {p.energy_j:10.4g} {sd}{mark}")
        out.append(f"optimal_freq_mhz: {self.best.freq_mhz:g}")
        return out


def fit_workload(request: CurveFitRequest, say: Callable[[str], None] = lambda _m: None) -> CurveFitOutcome:
    """Fit one workload's curves and predict every clock.

    Args:
        request: a CSV, or a sweep's workload (without --sweep-id: the newest sweep that measured it, said via `say`).
        say: where the line naming the sweep taken goes.

    Raises:
        DvfsError: neither or both of a CSV and a sweep, a sweep without the workload, bad `--clocks`, too few clocks.
    """
    r = request
    if bool(r.file) == bool(r.sweep_id or r.workload):
        raise DvfsError("give either FILE (a CSV of freq_mhz, time_s, energy_j rows) or --workload MODEL/TASK (of the newest sweep "
                        "that has it, or of --sweep-id ID)")
    if not r.file:
        if not r.workload:
            raise DvfsError("--sweep-id needs --workload MODEL/TASK")
        return _from_sweep(r, say)
    points = read_measurements_csv(r.file)
    chosen = _chosen(points, r.clocks)
    table = sorted({m.freq_mhz for m in points})
    shape = ORIN_VOLTAGE_SHAPE if r.voltage_shape is None else r.voltage_shape
    fit = fit_curve(chosen, voltage_shape=shape, f_max_mhz=max(table))
    return CurveFitOutcome(fit, fit.predict(table), sorted({m.freq_mhz for m in chosen}))


def _from_sweep(r: CurveFitRequest, say: Callable[[str], None]) -> CurveFitOutcome:
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.queries import newest_sweep, sweep_points
    from dvfs_mlops.model.power_prior import sweep_fits

    sweep_id = r.sweep_id
    if not sweep_id:
        sweep_id = newest_sweep(tracking.check_reachable(), r.experiment, workload=r.workload)
        say(f"sweep {sweep_id}: the newest in {r.experiment} with points of {r.workload} (no --sweep-id given)")
    sweep = sweep_points(r.experiment, sweep_id)
    name = _workload_name(r.workload, sorted(sweep.workloads), sweep.sweep_id)
    board = sweep.board if r.voltage_shape is None else dataclasses.replace(sweep.board, voltage_shape=r.voltage_shape)
    names = sorted(sweep.workloads)
    chosen = _chosen(sweep.workloads[name], r.clocks)
    fit = sweep_fits([chosen if n == name else sweep.workloads[n] for n in names], board, sweep.repeats)[names.index(name)]
    if fit is None:
        fit = fit_curve(chosen)  # fewer than two clocks: fit_curve's own one-line error names how many it got
    return CurveFitOutcome(fit, fit.predict(sorted(board.frequencies_mhz)), sorted({m.freq_mhz for m in chosen}))


def _workload_name(asked: str, names: list[str], sweep_id: str) -> str:
    """The sweep's workload `asked` names: its full name, or MODEL/TASK where one LoRA or 16-bit variant of it is all
    the sweep has (`bert-tiny/sst2` for `bert-tiny/sst2+lora-r8a16`)."""
    from dvfs_mlops.model.workload import split_variant

    if asked in names:
        return asked
    variants = [n for n in names if n.rsplit("/", 1)[0] + "/" + split_variant(n.rsplit("/", 1)[-1])[0] == asked]
    if len(variants) == 1:
        return variants[0]
    raise DvfsError(f"sweep {sweep_id!r} has no pinned points of workload {asked!r}; it has {', '.join(names)}")


def _chosen(points: list[Any], clocks: str) -> list[Any]:
    if not clocks.strip():
        return points
    try:
        wanted = [float(x) for x in clocks.split(",") if x.strip()]
    except ValueError:
        raise DvfsError(f"--clocks must be comma-separated numbers in MHz, got {clocks!r}") from None
    return select_clocks(points, wanted)
