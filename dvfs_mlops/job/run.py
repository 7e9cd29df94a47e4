"""One metered fine-tuning job: what a sweep point, `dvfs-mlops finetune` and the launcher's utilisation probe run.

A `Job` is a prepared workload and how it trains. `run_job` runs it under an open session in one of three modes:
- `train`: train and evaluate for real, on the job's torch device (`finetune.finetune`);
- `profile`: the twin's profile-only job: the batches are planned from the workload's cached token lengths and
  charged step by step, nothing is computed (no data, tokenizer, model config or torch needed);
- `replay`: the twin: the padded lengths of an earlier run of the same job (`replay_of`) are charged at this
  session's clock; numerics do not depend on the clock, so its loss and accuracy are that run's.
On the twin every step is charged the step trace of its padded length at the session's clock; real hardware ignores
the charge. `DvfsCallback` does not use `run_job`: there the user's `Trainer` is the loop.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.finetune import FinetuneConfig, FinetuneResult, StepWindows, cold_steps, finetune, profile_only

if TYPE_CHECKING:
    from dvfs_mlops.hw.device import FreqSession
    from dvfs_mlops.job.workloads.prepare import PreparedWorkload

TRAIN, PROFILE, REPLAY = "train", "profile", "replay"
MODES = (TRAIN, PROFILE, REPLAY)
# Warm-up steps metered apart (`FinetuneConfig.warmup_steps`) unless a command says otherwise: on hardware the first
# steps pay allocation, autotuning and lazy loading; the twin charges every step alike, so none there.
HARDWARE_WARMUP_STEPS = 3


def default_warmup_steps(simulated: bool) -> int:
    """The warm-up steps a job meters apart unless told: 3 on real hardware, 0 on the twin."""
    return 0 if simulated else HARDWARE_WARMUP_STEPS


def warmup_for(requested: int | None, simulated: bool, steps: int | None = None) -> int:
    """The warm-up steps a job meters apart: `requested` (--warmup-steps), else `default_warmup_steps`; given the job's
    `steps`, at most a quarter of them (`finetune.cold_steps`), the warm-up that runs."""
    wanted = default_warmup_steps(simulated) if requested is None else requested
    return wanted if steps is None else cold_steps(wanted, steps)


@dataclasses.dataclass(frozen=True)
class Job:
    """A prepared workload (`PreparedWorkload`) and how it trains.

    Attributes:
        workload: the model, task and data, prepared (lazily loaded).
        config: steps, batch size, learning rate, seed, precision, LoRA.
        torch_device: where training runs (the board's).
        pretrained: real weights to start from (a hub name or a folder), or None for a random init.
    """

    workload: PreparedWorkload
    config: FinetuneConfig
    torch_device: str = "cpu"
    pretrained: str | None = None


def run_job(job: Job, session: FreqSession | None, *, mode: str = TRAIN, replay_of: FinetuneResult | None = None,
            on_step: Callable[[int, float | None], None] | None = None) -> FinetuneResult:
    """Run `job` under `session` (an open `FreqSession`, or None to run it unmetered).

    Args:
        job: the workload and its training config.
        session: the session whose windows meter the job ("train", "eval"); the twin's charges each step.
        mode: `train`, `profile` or `replay` (module doc).
        replay_of: with `replay`, the earlier run of this job whose steps are charged again.
        on_step: called after each step with (step, loss or None); probe-and-refine moves the clock from it.

    Returns:
        The job's `FinetuneResult` (`model` is the trained model in `train` mode, else None).

    Raises:
        DvfsError: an unknown mode, or `replay` without the run to replay.
    """
    if mode not in MODES:
        raise DvfsError(f"unknown job mode {mode!r}; valid modes: {', '.join(MODES)}")
    cfg, workload = job.config, job.workload
    trace_for = workload.trace_provider(cfg.batch_size, cfg.trace_dtype) if session is not None and session.device.simulated else None
    if mode == REPLAY:
        if replay_of is None or trace_for is None or session is None:
            raise DvfsError("a replayed job needs the run it replays, on the twin")
        with StepWindows(session, job.torch_device, replay_of.warmup_steps) as windows:
            for step, n in enumerate(replay_of.padded_lengths):
                session.step(trace_for(n))
                if on_step is not None:
                    on_step(step, None)
                windows.step_done(step)
        return dataclasses.replace(replay_of, model=None, wall_time_s=0.0)
    if mode == PROFILE:
        return profile_only(workload.train_lengths, cfg, workload.task.metric, session=session, trace_for=trace_for, on_step=on_step,
                            torch_device=job.torch_device)
    return finetune(workload, cfg, session=session, trace_for=trace_for, torch_device=job.torch_device, on_step=on_step,
                    pretrained=job.pretrained)
