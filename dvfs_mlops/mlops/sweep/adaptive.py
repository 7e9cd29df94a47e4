"""`sweep --strategy adaptive`: per workload, only the clocks the curve model asks for.

MAXN first (the baseline, and the GPU utilisation the governor's features need), then the production governor's
clock for the workload (or the middle of the table when there is none), then whatever `curve.next_clock` asks for
until the optimum is pinned down (its fit leaning on the power prior of the workloads measured before this one,
once there are five): at most `MAX_PINNED` pinned clocks. Each measured clock is an ordinary point run (every
repeat), tagged `dvfs.strategy=adaptive`; no unmeasured clock is ever logged as a run. The parent run gets
`predicted.csv`: every clock of every workload as the curve model predicts it, with a `measured` column, the
predicted optimum marked. Those predictions are made once every workload is measured, with the board's power prior
(power_prior.py: what the sweep's other workloads say about each one's power curve) where at least five others have
three clocks; `curve fit --sweep-id` makes the same fits (`power_prior.sweep_fits`). Resume: points already
FINISHED are read back from the store, and the same choices are made again from them.

A sweep that tunes the CPU or memory clock too (`--knobs gpu,cpu[,emc]`) asks `model.joint.JointSearch` instead: after
maxn, the configurations it asks for (the GPU axis by the curve model at the top CPU and EMC clocks, then each other
knob's axis, then single table steps while they improve), at most `JOINT_BUDGET` distinct ones per workload, and it
picks the measured one of least energy (on the twin `energy_joint_j`: the rails the CPU and memory clocks feed
included). The parent run gets `configurations.csv` (every configuration measured, the
pick marked): measurements, not predictions.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.mlops.sweep.progress import device_label
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec
from dvfs_mlops.model.curve import Measurement, mean_measurement, next_clock
from dvfs_mlops.model.joint import JointResult, JointSearch, JointSpace, Measured
from dvfs_mlops.model.power_prior import MIN_CLOCKS, MIN_WORKLOADS, board_prior, sweep_fits

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

MAX_PINNED = 4
JOINT_BUDGET = 20  # distinct configurations a joint adaptive sweep measures per workload (model.joint.DEFAULT_BUDGET)
PREDICTIONS = "predicted.csv"
CONFIGURATIONS = "configurations.csv"
CONFIGURATION_COLUMNS = ("workload", "freq_mhz", "cpu_mhz", "emc_mhz", "time_s", "energy_j", "picked")
PREDICTED_COLUMNS = ("workload", "freq_mhz", "predicted_time_s", "predicted_power_w", "predicted_energy_j", "predicted_energy_std_j",
                     "measured", "predicted_optimum")

StartClock = Callable[[Any], float | None]  # workload features (gpu_util_pct measured at maxn) -> the governor's clock


class AdaptiveStrategy:
    """One clock of one workload per round, each chosen from what was measured before."""

    def __init__(self, spec: SweepSpec, start_clock: StartClock | None = None):
        self.spec = spec
        self.start_clock = start_clock
        self.workloads = [(m, t) for m in spec.models for t in spec.tasks]
        self.measured: list[tuple[str, list[Measurement]]] = []  # workload -> its measured clocks (repeats averaged)
        self.joint: list[tuple[str, JointResult]] = []  # a joint sweep: workload -> what its search measured and picked
        self._known: dict[str, Measurement] = {}

    def expected_points(self) -> int:
        per_workload = JOINT_BUDGET if self.spec.joint else MAX_PINNED
        return len(self.workloads) * (per_workload + 1) * self.spec.repeats

    def counted(self, done: set[str]) -> int:
        names = {Point(m, t, MAXN, 0, self.spec.variant).workload for m, t in self.workloads}
        return sum(key.rsplit("@", 1)[0] in names for key in done)

    def describe(self, runner: Any) -> str:
        sim = device_label(runner.board)
        each = (f"maxn + at most {JOINT_BUDGET} configurations ({','.join(self.spec.tuned)}) each" if self.spec.joint
                else f"maxn + at most {MAX_PINNED} clocks each")
        return (f"sweep {self.spec.sweep_id} (adaptive): {len(self.workloads)} workloads, {each}, "
                f"{self.counted(runner.done)} points already finished, on {runner.board.backend}{sim}; tracking {tracking.tracking_uri()}, "
                f"experiment id {runner.experiment_id}")

    def rounds(self, runner: Any) -> Iterator[list[Point]]:
        if self.spec.joint:
            yield from self._joint_rounds(runner)
            return
        board, spec = runner.board, self.spec
        table = sorted(board.frequencies_mhz)
        noise = board.noise(spec.repeats)  # a clock's measurement is the mean of its repeats
        self._known = measurements(runner.client, runner.experiment_id, spec.sweep_id)
        for model, task in self.workloads:
            at = [Point(model, task, MAXN, r, spec.variant) for r in range(spec.repeats)]
            yield at
            start = self._start(runner, at, table)
            measured: list[Measurement] = []
            # the workloads measured so far say what they can about this one's power curve: with their prior the stop rule
            # is satisfied sooner (fewer clocks); the same prior on resume, as they are read back in order
            so_far = board_prior([m for _, m in self.measured], voltage_shape=board.voltage_shape, f_max_mhz=board.f_max_mhz,
                                 noise=noise[1])
            while (f := next_clock(measured, table, start, max_clocks=MAX_PINNED, voltage_shape=board.voltage_shape, noise=noise,
                                   prior=so_far)) is not None:
                at = [Point(model, task, f, r, spec.variant) for r in range(spec.repeats)]
                yield at
                measured.append(mean_measurement(f, self._read(runner, at)))
            self.measured.append((Point(model, task, MAXN, 0, spec.variant).workload, measured))

    def _joint_rounds(self, runner: Any) -> Iterator[list[Point]]:
        """Per workload: maxn, then each configuration the joint search asks for (every repeat), then its pick."""
        board, spec = runner.board, self.spec
        table = sorted(board.frequencies_mhz)
        space = JointSpace(tuple(table), spec.cpu_freqs, spec.emc_freqs)
        self._known = measurements(runner.client, runner.experiment_id, spec.sweep_id)
        for model, task in self.workloads:
            at = [Point(model, task, MAXN, r, spec.variant) for r in range(spec.repeats)]
            yield at
            proposer = JointSearch(space, "energy", budget=JOINT_BUDGET, start_mhz=self._start(runner, at, table),
                                   voltage_shape=board.voltage_shape, noise=board.noise(spec.repeats))
            measured: list[Measured] = []
            while (setting := proposer.next_configuration(measured)) is not None:
                at = [Point(model, task, setting.gpu_mhz, r, spec.variant, setting.cpu_mhz, setting.emc_mhz) for r in range(spec.repeats)]
                yield at
                m = mean_measurement(setting.gpu_mhz, self._read(runner, at))
                measured.append(Measured(setting, m.time_s, m.energy_j, m.gpu_util))
            self.joint.append((Point(model, task, MAXN, 0, spec.variant).workload, JointResult(proposer.pick(measured), tuple(measured), "energy")))

    def _start(self, runner: Any, maxn: list[Point], table: list[float]) -> float:
        """Where the search starts: the governor's clock for the features with the utilisation measured at maxn."""
        start = None
        if self.start_clock is not None:
            util = [m.gpu_util for m in self._read(runner, maxn) if m.gpu_util is not None]
            features = runner.workload(maxn[0]).features
            start = self.start_clock(features.with_gpu_util(100.0 * sum(util) / len(util)) if util else features)
        return table[len(table) // 2] if start is None else float(start)

    def _read(self, runner: Any, points: list[Point]) -> list[Measurement]:
        """The points' FINISHED runs as measurements (asked of the store for the ones not read yet)."""
        for p in points:
            if p.key not in self._known:
                self._known.update(measurements(runner.client, runner.experiment_id, self.spec.sweep_id, p.key))
        missing = [p.key for p in points if p.key not in self._known]
        if missing:
            raise DvfsError(f"sweep {self.spec.sweep_id}: {', '.join(missing)} has no FINISHED run with time and energy to choose "
                            "the next clock from; re-run the same sweep to resume")
        return [self._known[p.key] for p in points]

    def finish(self, runner: Any) -> None:
        if self.spec.joint:
            log_configurations(runner.client, runner.parent_id, self.joint, runner.board)
            return
        log_predictions(runner.client, runner.parent_id, self.measured, runner.board, self.spec.repeats)


def configuration_rows(workloads: Sequence[tuple[str, JointResult]]) -> str:
    """configurations.csv's text: every configuration a joint adaptive sweep measured (repeats averaged), its pick
    marked; a clock left alone is empty."""
    buf = io.StringIO()
    buf.write(",".join(CONFIGURATION_COLUMNS) + "\n")
    for name, result in workloads:
        for m in result.measured:
            s = m.setting
            clocks = ",".join("" if v is None else f"{v:g}" for v in (s.gpu_mhz, s.cpu_mhz, s.emc_mhz))
            buf.write(f"{name},{clocks},{m.time_s!r},{m.energy_j!r},{int(s == result.pick)}\n")
    return buf.getvalue()


def log_configurations(c: MlflowClient, parent_id: str, workloads: Sequence[tuple[str, JointResult]], board: Board) -> None:
    """configurations.csv on a joint adaptive sweep's parent run (measurements, SIMULATED on the twin)."""
    tracking.log_text_artifact(c, parent_id, CONFIGURATIONS, configuration_rows(workloads))
    simulated = ", SIMULATED" if board.simulated else ""
    tracking.log_run_batch(c, parent_id, tags={schema.TAG_STRATEGY: "adaptive",
                                               schema.TAG_PREDICTIONS: f"configurations.csv (measured configurations, the joint search's pick{simulated})"})


def measurements(c: MlflowClient, exp_id: str, sweep_id: str, key: str | None = None) -> dict[str, Measurement]:
    """FINISHED point runs of the sweep (or the one point `key`) by point key, as measurements (freq 0 at maxn)."""
    where = f"tags.`{schema.TAG_SWEEP}` = '{sweep_id}' and attributes.status = 'FINISHED'"
    if key is not None:
        where += f" and tags.`{schema.TAG_POINT}` = '{key}'"
    out: dict[str, Measurement] = {}
    for r in c.search_runs([exp_id], filter_string=where, max_results=50000):
        k, m = r.data.tags.get(schema.TAG_POINT), r.data.metrics
        if k and "time_s" in m and "energy_j" in m:
            freq = r.data.params.get("freq_mhz", MAXN)
            util = m.get("gpu_util_pct")
            energy = m.get("energy_joint_j", m["energy_j"])  # a joint sweep on the twin: the rails every clock feeds
            out[k] = Measurement(0.0 if freq == MAXN else float(freq), m["time_s"], energy, None if util is None else util / 100.0)
    return out


def predicted_rows(workloads: Sequence[tuple[str, Sequence[Measurement]]], board: Board, repeats: int) -> tuple[str, list[Any]]:
    """predicted.csv's text, and the prior each workload's fit leaned on (None where it had none)."""
    fits = sweep_fits([m for _, m in workloads], board, repeats)
    table = sorted(board.frequencies_mhz)
    buf = io.StringIO()
    buf.write(",".join(PREDICTED_COLUMNS) + "\n")
    for (name, measured), fit in zip(workloads, fits):
        if fit is None:  # fewer than two clocks: nothing to predict from
            continue
        pred = fit.predict(table)
        best = min(pred, key=lambda p: p.energy_j).freq_mhz
        have = {m.freq_mhz for m in measured}
        for p in pred:
            sd = "" if p.energy_std_j is None else repr(p.energy_std_j)
            buf.write(f"{name},{p.freq_mhz:g},{p.time_s!r},{p.power_w!r},{p.energy_j!r},{sd},{int(p.freq_mhz in have)},"
                      f"{int(p.freq_mhz == best)}\n")
    return buf.getvalue(), [fit.prior if fit is not None else None for fit in fits]


def log_predictions(c: MlflowClient, parent_id: str, workloads: Sequence[tuple[str, Sequence[Measurement]]], board: Board, repeats: int) -> None:
    """predicted.csv on the parent run: PREDICTIONS (the curve model), not measurements; `measured` says which clocks were
    run. Each workload's power curve leans on the board prior from the others where there is one (tag dvfs.power_prior)."""
    text, priors = predicted_rows(workloads, board, repeats)
    with_prior = [p for p in priors if p is not None]
    if with_prior:
        mean = sorted(p.log_ratio_mean for p in with_prior)[len(with_prior) // 2]
        spread = sorted(p.log_ratio_sd for p in with_prior)[len(with_prior) // 2]
        said = (f"{len(with_prior)} of {len(priors)} workloads, each from the others; idle share {with_prior[0].idle_share:g}, "
                f"log dynamic/static ratio {mean:.3f} +- {spread:.3f} (medians)")
    else:
        said = (f"none (it needs the GPU utilisation of at least {MIN_WORKLOADS + 1} workloads measured at {MIN_CLOCKS} or more "
                "clocks)")
    tracking.log_text_artifact(c, parent_id, PREDICTIONS, text)
    simulated = ", SIMULATED points" if board.simulated else ""
    tracking.log_run_batch(c, parent_id, tags={schema.TAG_STRATEGY: "adaptive", schema.TAG_PREDICTIONS: f"predicted.csv (curve model{simulated})",
                                               schema.TAG_POWER_PRIOR: said})
