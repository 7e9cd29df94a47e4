"""`dvfs-mlops finetune`: from the command's job request to a `Job` on the chosen board, then the launcher.

The request names the model as a sweep names it (a preset, a config file or folder, a hub name) and may leave the
learning rate to its default (`default_learning_rate`); `finetune` resolves both, checks the store, prepares the
workload, opens the device and resolves its board before `app.finetune.run_finetune` decides and runs.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dvfs_mlops.app.devices import DeviceChoice, load_twin, open_chosen
from dvfs_mlops.app.links import run_link_lines
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec

if TYPE_CHECKING:
    from dvfs_mlops.app.finetune import LaunchOptions

SCRATCH_LEARNING_RATE = 1e-3  # a randomly initialised small model
PRETRAINED_LEARNING_RATE = 5e-5  # real weights


@dataclasses.dataclass(frozen=True)
class FinetuneJobRequest:
    """The job `dvfs-mlops finetune` is asked to run: the model, the task and its data, and how it trains.

    Attributes:
        model: a preset, a transformers config.json or folder, or a hub name ORG/NAME ('' with `model_config` or
            `pretrained`).
        model_config: a transformers config.json (or folder) instead of a preset.
        task: a GLUE task or instruct.
        pretrained: real weights and tokenizer: a hub name or a local folder ('': a random init).
        steps: training steps (`epochs` overrides them).
        epochs: epochs instead of steps (None: `steps`).
        batch_size: examples per training step.
        learning_rate: None: `default_learning_rate`.
        precision: fp32, bf16 or fp16.
        peft: full fine-tuning or LoRA.
        data_source: synthetic, tsv or hub.
        data_dir: a GLUE TSV (or instruct JSONL) folder ('': none; given, it implies tsv).
        train_size: synthetic training examples.
        seed: data, model init and sampling.
        warmup_steps: the first steps metered apart (None: 3 on hardware, 0 on the twin; at most a quarter).
        knobs: NAME=VALUE settings of the job (`mlops.fields.KNOBS`; each at its `FinetuneConfig` default unless set).
    """

    model: str = ""
    model_config: str = ""
    task: str = ""
    pretrained: str = ""
    steps: int = 60
    epochs: float | None = None
    batch_size: int = 16
    learning_rate: float | None = None
    precision: str = "fp32"
    peft: PeftSpec = FULL
    data_source: str = "synthetic"
    data_dir: str = ""
    train_size: int = 2048
    seed: int = 0
    warmup_steps: int | None = None
    knobs: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class FinetuneReport:
    """What `dvfs-mlops finetune` did: the launcher's JSON-able summary, and the MLflow UI link lines of its run
    (none after a dry run)."""

    summary: dict[str, Any]
    link: list[str]


def resolve_model_names(request: FinetuneJobRequest) -> FinetuneJobRequest:
    """The request with --model resolved as `sweep --models` resolves it: a config file or folder, or a hub name,
    becomes the entry's name with its config path or pretrained source; a preset (or a request that names its
    config or weights itself) is left as it is.

    Raises:
        DvfsError: no model named at all, or --model names no preset, config or hub model.
    """
    r = request
    if not (r.model or r.model_config or r.pretrained):
        raise DvfsError("name the model: --model PRESET, --model-config PATH or --pretrained NAME_OR_PATH")
    from dvfs_mlops.job.workloads.zoo import PRESETS, model_entry

    if not r.model or r.model_config or r.pretrained or r.model in PRESETS:
        return r
    entry = model_entry(r.model)
    return dataclasses.replace(r, model=entry.name, model_config=entry.config_path or "", pretrained=entry.pretrained or "")


def default_learning_rate(request: FinetuneJobRequest) -> float:
    """The request's learning rate, else 5e-5 when it starts from real weights and 1e-3 from scratch."""
    if request.learning_rate is not None:
        return request.learning_rate
    return PRETRAINED_LEARNING_RATE if request.pretrained else SCRATCH_LEARNING_RATE


def finetune(request: FinetuneJobRequest, choice: DeviceChoice, options: LaunchOptions, quiet: bool = False,
             say: Callable[[str], None] = lambda _m: None) -> FinetuneReport:
    """`dvfs-mlops finetune`: resolve the job, open the board, then decide, pin, fine-tune, log and restore.

    Args:
        request: the job.
        choice: the device to run on.
        options: the governor, the probe, refine, observe, dry run.
        quiet: the summary goes out as JSON: the launcher does not announce the device.
        say: where the decision and progress lines go.

    Returns:
        The `FinetuneReport`.

    Raises:
        DvfsError: no model, an unknown model, task or twin profile, an unreachable store, a device that cannot be
            opened or CUDA missing (all before any clock is touched), or as `run_finetune`.
    """
    from dvfs_mlops.app.finetune import run_finetune
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.run import Job, warmup_for
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.fields import parse_knobs

    if choice.backend == "replay":  # nothing trains: a decision on the grid's workload (`--task`), looked up
        from dvfs_mlops.app.replay_decide import replay_dry_run

        named = bool(request.model or request.model_config or request.pretrained)
        return FinetuneReport(replay_dry_run(request.task, named, choice, dataclasses.replace(options, announce_device=not quiet), say), [])
    r = resolve_model_names(request)
    knobs = parse_knobs(r.knobs)  # a misspelt knob: at once
    twin = load_twin(choice)
    if not options.dry_run:  # a dry run asks the store only if its governor is not remembered (mlops.governor)
        tracking.check_reachable()
    prepared = prepare_workload(r.model or None, r.task, model_config_path=r.model_config or None, pretrained=r.pretrained or None,
                                data_source=r.data_source, data_dir=r.data_dir or None, seed=r.seed, train_size=r.train_size,
                                peft=r.peft, precision=r.precision)
    dev = open_chosen(choice, twin)
    board = board_of(dev, choice.torch_device or None)  # CUDA missing: stop before the probe touches anything
    cfg = FinetuneConfig(steps=r.steps, epochs=r.epochs, batch_size=r.batch_size, learning_rate=default_learning_rate(r), seed=r.seed,
                         precision=r.precision, peft=r.peft, warmup_steps=warmup_for(r.warmup_steps, board.simulated), **knobs)
    launch = dataclasses.replace(options, announce_device=not quiet)
    summary = run_finetune(dev, board, Job(prepared, cfg, board.torch_device, r.pretrained or None), launch, say=say)
    return FinetuneReport(summary, run_link_lines(summary["run_id"]) if summary.get("run_id") else [])
