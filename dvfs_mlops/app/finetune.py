"""`dvfs-mlops finetune`: load the production governor of the board's family, decide, pin, fine-tune, log, restore.

Without a governor of the board's family the job refines from the curve model instead (`mlops.governor.
governor_for_board`: one line says why); another family's governor decides only with --allow-other-board."""
from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.job.finetune import FinetuneResult, num_steps, plan_batches
from dvfs_mlops.job.run import PROFILE, TRAIN, Job, run_job
from dvfs_mlops.job.workloads.tokenizer import padded_length
from dvfs_mlops.mlops import lifecycle, records, schema, tracking
from dvfs_mlops.mlops.launch import Decision, Launch, Launched, LaunchOptions, decide, refine_budget

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.job.refine import RefineResult
    from dvfs_mlops.job.workloads.prepare import PreparedWorkload
    from dvfs_mlops.mlops.lifecycle import OwnedRun

__all__ = ["Decision", "LaunchOptions", "measure_gpu_util", "plan_decision", "run_finetune", "twin_curve"]

log = logging.getLogger(__name__)


def twin_curve(job: Job, device: Device) -> Any:
    """The twin's view of this job: per-step estimates for the median padded length of its batches (on the sim
    device's own profile when `device` is the twin, else on the default one)."""
    twin, trace = _twin_and_trace(job, device)
    return twin.curve(trace)


def _twin_and_trace(job: Job, device: Device) -> tuple[Any, Any]:
    """(the twin: the sim device's own profile when `device` is the twin, else the default one; the job's step trace
    for the median padded length of its batches)."""
    from dvfs_mlops.hw.sim import SimDevice

    w, cfg = job.workload, job.config
    batches = plan_batches(w.n_train, max(1, num_steps(cfg, w.n_train)), cfg.batch_size, cfg.seed)
    lengths = sorted(padded_length([w.train_lengths[i] for i in b]) for b in batches)
    trace = w.trace_provider(cfg.batch_size, cfg.trace_dtype)(lengths[len(lengths) // 2])
    return SimDevice(params=getattr(device, "params", None) if device.simulated else None), trace


def measure_gpu_util(device: Device, board: Board, job: Job, probe_steps: int, observe: bool = False) -> tuple[float, str]:
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


def _probe(device: Device, board: Board, job: Job, warm: int, steps: int, observe: bool) -> EnergyReport:
    """The probe's "train" window: `warm` warm-up steps metered apart, then `steps` steps at maxn."""
    # the probe measures how busy the GPU is, which the weights do not change: a random init, no weights to load
    config = dataclasses.replace(job.config, steps=warm + steps, epochs=None, warmup_steps=warm)
    session = device.session(MAXN, observe=observe, label="probe")
    with session:
        run_job(dataclasses.replace(job, config=config, pretrained=None), session, mode=PROFILE if board.simulated else TRAIN)
    return session.report()


def plan_decision(device: Device, board: Board, job: Job, options: LaunchOptions, say: Callable[[str], None]) -> Decision:
    """The launcher's decision (`launch.decide`): the governor of the board's family (or none: one line, then refine),
    the utilisation measured by a probe at maxn (or the twin's estimate), the clock, the twin's expected saving."""
    from dvfs_mlops.hw import describe_device

    def measure() -> tuple[float | None, str]:
        if options.announce_device:
            say(describe_device(device))
        return measure_gpu_util(device, board, job, options.probe_steps, options.observe)

    decision = decide(board, options, job.workload.features, measure, say, device)
    if decision.refines_without_governor:  # refine's start says nothing of the saving
        return decision
    return dataclasses.replace(decision, expected_saving=_expected_saving(job, device, decision))


def _expected_saving(job: Job, device: Device, decision: Decision) -> float | None:
    """The twin's estimate of the saving at the decided clock against maxn (for a configuration, on the joint energy of
    the rails every clock feeds); None where the twin cannot trace the job."""
    freq = float(decision.freq_mhz)
    try:
        if decision.knob_clocks():
            twin, trace = _twin_and_trace(job, device)
            at, top = twin.expected(trace, decision.setting), twin.expected(trace)
            return 1.0 - at.energy_joint_expected_j / top.energy_joint_expected_j
        curve, maxn = twin_curve(job, device)
        nearest = min(curve, key=lambda f: abs(f - freq))
        return 1.0 - curve[nearest].energy_j / maxn.energy_j
    except Exception:  # noqa: BLE001 - an estimate only; a custom config the twin can't trace just has none
        return None


def run_finetune(device: Device, board: Board, job: Job, options: LaunchOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The launcher: decide, pin, fine-tune with metering, log one run to `dvfs-finetune`, restore.

    The run exists from the job's start (`lifecycle.owned_run`: under `mlflow run` MLflow's own) and ends FINISHED,
    KILLED (Ctrl-C, SIGTERM, SIGHUP) or FAILED with the reason, keeping what was logged before.

    Args:
        device: the open device.
        board: its `Board` (where training runs is `job.torch_device`, resolved with it).
        job: the prepared workload and its training config.
        options: the governor, the probe, refine, observe, dry run (`LaunchOptions`).
        say: where the decision and progress lines go.

    Returns:
        A JSON-able summary: the decision, and the run's id, experiment and metrics unless it was a dry run.

    Raises:
        DvfsError: the store is unreachable or no governor is in production (before any clock is touched), the
            governor cannot decide, a clock write is refused, or the restore failed.
    """
    if options.dry_run:  # a dry run may need no store (mlops.governor remembers a decision's governor)
        decision = plan_decision(device, board, job, options, say)
        _say_all(say, decision.lines())
        say("dry run: stopping after the decision (no clock was changed)")
        return _summary(decision, board, job)
    c = tracking.check_reachable()  # before any clock is touched
    job.workload.materialize()  # data, tokenizer, encoded splits: loaded before any clock is touched
    tags = {schema.TAG_SIMULATED: str(board.simulated).lower(), schema.TAG_WORKLOAD: job.workload.name,
            schema.TAG_BOARD_FAMILY: board.family}
    tables = options.knob_tables(device)  # a clock to tune that the backend cannot set: before the run is made
    with lifecycle.owned_run(schema.FINETUNE_EXPERIMENT, name=job.workload.name, tags=tags, client=c) as run:
        decision = plan_decision(device, board, job, options, say).with_knobs_at_top(tables)
        _say_all(say, decision.lines())
        run.log_batch(tags={**decision.tags(), schema.TAG_RUN_NAME: f"{job.workload.name}@{decision.freq_mhz:g}"})
        pinned = decision.setting.label() if decision.setting is not None else f"{decision.freq_mhz:g} MHz"  # GPU [/ CPU / EMC]
        observing = f"observing on {board.backend}{_sim(board)} (clocks left as found; would pin {pinned})"
        say(f"{observing if options.observe else f'pinning {pinned} on {board.backend}{_sim(board)}'}, "
            f"fine-tuning on {job.torch_device} ...")
        launch = Launch(device, board, decision, refine=refine_budget(decision, options, board, say), observe=options.observe,
                        label="finetune", say=say, knobs=tables)
        done = launch.run(job)
        result = done.result
        assert result is not None
        base = records.job_record(job, board, done.session, result, done.settled_mhz)
        run.log(base.plus(params={"gpu_util_probe_pct": round(decision.features.gpu_util_pct or 0.0, 3) if decision.features else 0.0,
                                  **done.knob_params()},
                          metrics={"expected_saving_vs_maxn": decision.expected_saving}))
        if done.refined is not None:
            _log_refine(run, done.refined, job.workload.name, board.simulated)
        if options.save_model and result.model is not None:
            _log_model(run, result, job.workload)
    say(_done_line(done, result, options.observe, board.simulated, run))
    if (lost := records.clock_lost_line(done.session)) is not None:
        say(lost)
    summary = _summary(decision, board, job)
    summary.update({"run_id": run.run_id, "experiment": run.experiment_name,
                    "metrics": {k: v for k, v in base.metrics.items() if v is not None}})
    if done.refined is not None:
        r = done.refined
        summary["refine"] = {"start_mhz": r.start_mhz, "chosen_mhz": r.chosen_mhz, **r.chosen_knobs, "reason": r.reason,
                             "probes": [dataclasses.asdict(p) for p in r.probes], "simulated": board.simulated}
    return summary


def _say_all(say: Callable[[str], None], lines: list[str]) -> None:
    for line in lines:
        say(line)


def _sim(board: Board) -> str:
    return " (SIMULATED)" if board.simulated else ""


def _summary(decision: Decision, board: Board, job: Job) -> dict[str, Any]:
    return {"decision": decision.to_dict(), "device": board.backend, "device_profile": board.profile,
            "simulated": board.simulated, "workload": job.workload.name}


def _done_line(done: Launched, result: FinetuneResult, observe: bool, simulated: bool, run: OwnedRun) -> str:
    session, refined = done.session, done.refined
    report, whole = session.report(), session.session_report()
    parts = [f"{name} {session.windows[name].energy_j:.1f} J" for name in ("warmup", "eval") if name in session.windows]
    job = f"; the whole job {whole.energy_j:.1f} J in {whole.duration_s:.2f} s" + (f" ({', '.join(parts)})" if parts else "")
    label = " (SIMULATED)" if simulated else ""
    measured = f", measured {report.clock_mhz_measured:.0f} MHz" if report.clock_mhz_measured is not None else ""
    held = "; WARNING: the clock did not hold at the pinned value" if report.clock_held is False else ""
    where_clock = "under the clocks as found (observe)" if observe else f"at {done.settled_mhz:g} MHz"
    if refined is not None and refined.probes:
        where_clock += f" (after {refined.probe_steps} probe steps, included)"
    value = "n/a" if result.eval_value is None else f"{result.eval_value:.3f}"
    return (f"done{label}: {report.energy_j:.1f} J CPU+GPU in {report.duration_s:.2f} s of training {where_clock}{measured}{job}; "
            f"{result.eval_metric} {value}; run {run.run_id} in {run.experiment_name}"
            + ("" if observe else "; clocks restored") + held)


def _log_model(run: OwnedRun, result: FinetuneResult, workload: PreparedWorkload) -> None:
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
        run.client.log_artifacts(run.run_id, str(out), artifact_path="model")


def _log_refine(run: OwnedRun, refined: RefineResult, workload: str, simulated: bool) -> None:
    """The probes and the choice: tags (and the run's name at the settled clock), and refine.csv."""
    knobs = "".join(f"/{k[:3]}{v:g}" for k, v in refined.chosen_knobs.items())  # the CPU/memory clocks refine settled on
    tags = {**records.refine_tags(refined), schema.TAG_RUN_NAME: f"{workload}@{refined.chosen_mhz:g}{knobs}"}
    if simulated:
        tags[schema.TAG_REFINE_SIMULATED] = "true"
    run.log_batch(tags=tags, metrics={"refine_probe_steps": float(refined.probe_steps)})
    run.log_text("refine.csv", refined.to_csv())
