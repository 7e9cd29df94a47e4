"""`dvfs-mlops finetune`: load the production governor of the board's family, decide, pin, fine-tune, log, restore.

Without a governor of the board's family the job refines from the curve model instead (`mlops.governor.
governor_for_board`: one line says why); another family's governor decides only with --allow-other-board."""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.job.finetune import num_steps, plan_batches
from dvfs_mlops.job.run import PROFILE, TRAIN, Job, run_job
from dvfs_mlops.job.workloads.tokenizer import padded_length
from dvfs_mlops.mlops import records, schema, tracking
from dvfs_mlops.mlops.governor import BoardGovernor, Governor, GovernorRef
from dvfs_mlops.model.workload import WorkloadFeatures

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How `finetune` decides and runs (besides the job itself).

    Attributes:
        governor_uri: the governor to ask (default: the registry's production alias).
        probe_steps: steps at maxn that measure the GPU utilisation feature; 0: the twin's estimate.
        dry_run: stop after the decision (nothing trained or logged).
        strict: refuse a governor trained for another device profile.
        save_model: log the fine-tuned model as an artifact.
        observe: meter only, write no clock (no root needed).
        refine: probe-and-refine's step budget (None: the board's default, `default_refine`; 0: off).
        announce_device: say which device runs the job.
        allow_other_board: a governor of another board family may decide (recorded on the run).
    """

    governor_uri: str | None = None
    probe_steps: int = 5
    dry_run: bool = False
    strict: bool = False
    save_model: bool = True
    observe: bool = False
    refine: int | None = None
    announce_device: bool = False
    allow_other_board: bool = False


@dataclasses.dataclass
class Decision:
    """The clock the governor chose for a job, and why."""

    freq_mhz: float
    path: str  # "num_layers=12 > 7, avg_seq_len=71.3 > 53 -> 816 MHz"
    features: WorkloadFeatures
    governor: GovernorRef
    expected_saving: float | None  # twin's estimate vs maxn (simulated)
    util_source: str  # how gpu_util_pct was obtained
    board_governor: BoardGovernor | None = None  # what decided on this board's family (None: a caller's own Decision)

    @property
    def refines_without_governor(self) -> bool:
        """No governor of the board's family: the clock is refine's start, and refine picks the one the job runs at."""
        return self.board_governor is not None and self.board_governor.governor is None

    def to_dict(self) -> dict[str, Any]:
        out = {"freq_mhz": self.freq_mhz, "path": self.path, "features": self.features.as_row(), "governor": self.governor.to_dict(),
               "expected_saving_vs_maxn": self.expected_saving, "expected_saving_simulated": True, "gpu_util_source": self.util_source}
        if self.board_governor is not None:
            out.update({"board_family": self.board_governor.family, "other_board": self.board_governor.other_board})
            if self.board_governor.note:
                out["reason"] = self.board_governor.note
        return out

    def lines(self) -> list[str]:
        """The decision as the launcher says it: the governor, the features, the path, the twin's expected saving."""
        shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.features.as_row().items()]
        governor = self.governor.label if self.governor.uri else f"none for {self.board_governor.family if self.board_governor else '?'}"
        path = self.path + (f", starting at {self.freq_mhz:g} MHz" if self.refines_without_governor else "")
        out = [f"governor: {governor}", "features: " + ", ".join(shown) + f"  [gpu util: {self.util_source}]",
               f"decision: {path}"]
        if self.expected_saving is not None:
            out.append(f"expected saving vs maxn: {100 * self.expected_saving:.1f}% (twin estimate, SIMULATED)")
        return out


def twin_curve(job: Job, device: Any) -> Any:
    """The twin's view of this job: per-step estimates for the median padded length of its batches (on the sim
    device's own profile when `device` is the twin, else on the default one)."""
    from dvfs_mlops.hw.sim import SimDevice

    w, cfg = job.workload, job.config
    batches = plan_batches(w.n_train, max(1, num_steps(cfg, w.n_train)), cfg.batch_size, cfg.seed)
    lengths = sorted(padded_length([w.train_lengths[i] for i in b]) for b in batches)
    trace = w.trace_provider(cfg.batch_size, cfg.trace_dtype)(lengths[len(lengths) // 2])
    return SimDevice(params=getattr(device, "params", None) if device.simulated else None).curve(trace)


def measure_gpu_util(device: Any, board: Board, job: Job, probe_steps: int, observe: bool = False) -> tuple[float, str]:
    """GPU utilisation at maxn: a short probe of the job on the board's GPU, or (0 steps) the twin's estimate.

    The probe runs under the board's default clocks; `observe=True` takes no lock either.

    Raises:
        DvfsError: the backend read no utilisation during the probe.
    """
    if probe_steps <= 0:
        _, maxn = twin_curve(job, device)
        return 100.0 * maxn.gpu_util, "twin estimate (--probe-steps 0)"
    job.workload.materialize()  # the probe trains: data, tokenizer and model config, before the session starts
    warm = job.config.warmup_steps
    steps = max(probe_steps, 3 * warm)  # measured after the job's warm-up, which stays at most a quarter of the probe
    report = _probe(device, board, job, warm, steps, observe)
    if not board.simulated and 0 < report.duration_s < MIN_PROBE_S:  # too short to be a mean: once more, long enough
        steps = math.ceil(steps * MIN_PROBE_S / report.duration_s)
        report = _probe(device, board, job, warm, steps, observe)
    if report.gpu_util_pct is None:
        raise DvfsError(f"the {board.backend} backend could not read GPU utilisation during the probe; use --probe-steps 0 for the twin's estimate")
    after = f" after {warm} warm-up" if warm else ""
    return float(report.gpu_util_pct), f"probe: {steps} steps at maxn{after}" + (" (SIMULATED)" if board.simulated else "")


# NVML's utilisation is the share of a sample period (1/6 s to 1 s by product) with a kernel running
# (nvmlDeviceGetUtilizationRates, https://docs.nvidia.com/deploy/nvml-api/structnvmlUtilization__t.html), and the
# Jetson's devfreq load a moving window of the GPU's busy time: a probe window shorter than a few such periods is
# not a mean.
MIN_PROBE_S = 2.0


def _probe(device: Any, board: Board, job: Job, warm: int, steps: int, observe: bool) -> Any:
    """The probe's "train" window: `warm` warm-up steps metered apart, then `steps` steps at maxn."""
    # the probe measures how busy the GPU is, which the weights do not change: a random init, no weights to load
    config = dataclasses.replace(job.config, steps=warm + steps, epochs=None, warmup_steps=warm)
    session = device.session(MAXN, observe=observe, label="probe")
    with session:
        run_job(dataclasses.replace(job, config=config, pretrained=None), session, mode=PROFILE if board.simulated else TRAIN)
    return session.report()


def plan_decision(device: Any, board: Board, job: Job, options: LaunchOptions,
                  say: Callable[[str], None]) -> tuple[Decision, Governor | None]:
    """Resolve what decides on this board (`governor_for_board`: a missing store or URI is an error before the device
    is used; no governor of the family is one line, then refine), measure the utilisation, decide."""
    from dvfs_mlops.hw import describe_device
    from dvfs_mlops.mlops.governor import governor_for_board

    chosen = governor_for_board(board, options.governor_uri, allow_other_board=options.allow_other_board,
                                strict=options.strict, say=say)
    if chosen.note:
        say(chosen.note)
    if not options.observe:
        chosen.refine_budget(options.refine, default_refine(board))  # no governor and --refine 0: refused before the device is used
    governor = chosen.governor
    if options.announce_device:
        say(describe_device(device))
    util, source = measure_gpu_util(device, board, job, options.probe_steps, options.observe)
    features = job.workload.features.with_gpu_util(util)
    freq, path = chosen.decide(features, board)
    saving = _expected_saving(job, device, freq) if governor is not None else None  # refine's start says nothing of it
    return Decision(freq, path, features, chosen.ref, saving, source, chosen), governor


def _expected_saving(job: Job, device: Any, freq: float) -> float | None:
    """The twin's estimate of the saving at `freq` against maxn; None where the twin cannot trace the job."""
    try:
        curve, maxn = twin_curve(job, device)
        nearest = min(curve, key=lambda f: abs(f - freq))
        return 1.0 - curve[nearest].energy_j / maxn.energy_j
    except Exception:  # noqa: BLE001 - an estimate only; a custom config the twin can't trace just has none
        return None


def default_refine(board: Board) -> int:
    """The probe budget `finetune` uses unless told: 30 steps on real boards, none on the twin."""
    return 0 if board.simulated else 30


def run_finetune(device: Any, board: Board, job: Job, options: LaunchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The launcher: decide, pin, fine-tune with metering, log one run to `dvfs-finetune`, restore.

    Args:
        device: the open device.
        board: its `Board` (where training runs is `job.torch_device`, resolved with it).
        job: the prepared workload and its training config.
        options: the governor, the probe, refine, observe, dry run (`LaunchOptions`).
        say: where the decision and progress lines go.

    Returns:
        A JSON-able summary: the decision, and the run's id and metrics unless it was a dry run.

    Raises:
        DvfsError: the store is unreachable or no governor is in production (before any clock is touched), the
            governor cannot decide, a clock write is refused, or the restore failed.
    """
    c = None if options.dry_run else tracking.check_reachable()  # before any clock is touched (a dry run may need no store)
    decision, _ = plan_decision(device, board, job, options, say)
    for line in decision.lines():
        say(line)
    summary: dict[str, Any] = {"decision": decision.to_dict(), "device": board.backend, "device_profile": board.profile,
                               "simulated": board.simulated, "workload": job.workload.name}
    if options.dry_run:
        say("dry run: stopping after the decision (no clock was changed)")
        return summary
    job.workload.materialize()  # data, tokenizer, encoded splits: loaded before the run is created or any clock is touched
    run_id, ours = _open_run(c, job, decision, board)
    try:
        session, result, refined = _finetune_at(device, board, job, decision, options, say)
        settled = refined.chosen_mhz if refined is not None else decision.freq_mhz
        base = records.job_record(job, board, session, result, settled)
        base.plus(params={"gpu_util_probe_pct": round(decision.features.gpu_util_pct or 0.0, 3)},
                  metrics={"expected_saving_vs_maxn": decision.expected_saving}).log(c, run_id)
        if refined is not None:
            _log_refine(c, run_id, refined, job.workload.name, board.simulated)
        if options.save_model and result.model is not None:
            _log_model(c, run_id, result, job.workload)
        if ours:
            c.set_terminated(run_id, "FINISHED")
    except BaseException:
        if ours:
            c.set_terminated(run_id, "FAILED" if not isinstance(sys.exc_info()[1], KeyboardInterrupt) else "KILLED")
        raise
    say(_done_line(session, result, settled, refined, options.observe, board.simulated, run_id))
    summary.update({"run_id": run_id, "metrics": {k: v for k, v in base.metrics.items() if v is not None}})
    if refined is not None:
        summary["refine"] = {"start_mhz": refined.start_mhz, "chosen_mhz": refined.chosen_mhz, "reason": refined.reason,
                             "probes": [dataclasses.asdict(p) for p in refined.probes], "simulated": board.simulated}
    return summary


def _open_run(c: Any, job: Job, decision: Decision, board: Board) -> tuple[str, bool]:
    """(the run to log into, whether this command made it): under `mlflow run` MLflow's own, else a new one."""
    g = decision.governor
    tags = {schema.TAG_GOVERNOR_NAME: str(g.name or ""), schema.TAG_GOVERNOR_VERSION: str(g.version or ""),
            schema.TAG_GOVERNOR_ALIAS: str(g.alias or ""), schema.TAG_GOVERNOR_URI: g.uri, schema.TAG_DECISION_PATH: decision.path,
            schema.TAG_SIMULATED: str(board.simulated).lower(), schema.TAG_WORKLOAD: job.workload.name,
            schema.TAG_BOARD_FAMILY: board.family}
    if decision.board_governor is not None:
        tags.update(decision.board_governor.tags())
    env_run = settings.mlflow_run_id()
    if env_run:
        tracking.log_run_batch(c, env_run, tags=tags)
        return env_run, False
    exp_id = tracking.experiment_id(c, schema.FINETUNE_EXPERIMENT)
    return c.create_run(exp_id, run_name=f"{job.workload.name}@{decision.freq_mhz:g}", tags=tags).info.run_id, True


def _finetune_at(device: Any, board: Board, job: Job, decision: Decision, options: LaunchOptions,
                 say: Callable[[str], None]) -> tuple[Any, Any, Any]:
    """(the session, the result, refine's result or None): the job pinned at the decided clock (probing first with
    refine, leaning on the power prior the governor's version carries for this board)."""
    freq = decision.freq_mhz
    session = device.session(freq, observe=options.observe, label="finetune")
    sim = " (SIMULATED)" if board.simulated else ""
    say(f"observing on {board.backend}{sim} (clocks left as found; would pin {freq:g} MHz), fine-tuning on {job.torch_device} ..."
        if options.observe else f"pinning {freq:g} MHz on {board.backend}{sim}, fine-tuning on {job.torch_device} ...")
    if decision.board_governor is not None:
        budget = decision.board_governor.refine_budget(options.refine, default_refine(board))
    else:
        budget = default_refine(board) if options.refine is None else options.refine
    if budget and options.observe:
        say("refine: off under --observe (nothing is pinned, so there is no clock to move)")
        budget = 0
    refiner = None
    with session:
        if budget:
            from dvfs_mlops.job.refine import WARMUP_STEPS, Refiner

            total = num_steps(job.config, job.workload.n_train)  # probing starts after the metered warm-up
            refiner = Refiner(session, budget, total, board, prior=decision.governor.power_prior_for(board), say=say,
                              warmup=max(WARMUP_STEPS, job.config.cold_steps(total)))
        result = run_job(job, session, on_step=refiner.on_step if refiner else None)
    return session, result, refiner.result if refiner is not None else None


def _done_line(session: Any, result: Any, settled: float, refined: Any, observe: bool, simulated: bool, run_id: str) -> str:
    report, whole = session.report(), session.session_report()
    parts = [f"{name} {session.windows[name].energy_j:.1f} J" for name in ("warmup", "eval") if name in session.windows]
    job = f"; the whole job {whole.energy_j:.1f} J in {whole.duration_s:.2f} s" + (f" ({', '.join(parts)})" if parts else "")
    label = " (SIMULATED)" if simulated else ""
    measured = f", measured {report.clock_mhz_measured:.0f} MHz" if report.clock_mhz_measured is not None else ""
    held = "; WARNING: the clock did not hold at the pinned value" if report.clock_held is False else ""
    where_clock = "under the clocks as found (observe)" if observe else f"at {settled:g} MHz"
    if refined is not None and refined.probes:
        where_clock += f" (after {refined.probe_steps} probe steps, included)"
    return (f"done{label}: {report.energy_j:.1f} J CPU+GPU in {report.duration_s:.2f} s of training {where_clock}{measured}{job}; "
            f"{result.eval_metric} {result.eval_value:.3f}; run {run_id} in {schema.FINETUNE_EXPERIMENT}"
            + ("" if observe else "; clocks restored") + held)


def _log_model(c: Any, run_id: str, result: Any, workload: Any) -> None:
    """The fine-tuned model and its tokenizer under the run's `model/`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        out.mkdir(parents=True, exist_ok=True)
        result.model.save_pretrained(out)
        enc = workload.encoder
        if hasattr(enc.backend, "save_pretrained"):
            enc.backend.save_pretrained(out)
        else:
            enc.backend.save(str(out / "tokenizer.json"))
        c.log_artifacts(run_id, str(out), artifact_path="model")


def _log_refine(c: Any, run_id: str, refined: Any, workload: str, simulated: bool) -> None:
    """The probes and the choice: tags (and the run's name at the settled clock), and refine.csv."""
    tags = {**records.refine_tags(refined), schema.TAG_RUN_NAME: f"{workload}@{refined.chosen_mhz:g}"}
    if simulated:
        tags[schema.TAG_REFINE_SIMULATED] = "true"
    tracking.log_run_batch(c, run_id, tags=tags, metrics={"refine_probe_steps": float(refined.probe_steps)})
    tracking.log_text_artifact(c, run_id, "refine.csv", refined.to_csv())
