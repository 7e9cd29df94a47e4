"""The fine-tuning loop: transformers sequence classifier (or causal LM), AdamW, dynamic padding, fixed steps.

Seeded and deterministic on CPU: the same seed gives the same batches, losses and accuracy at
every clock. The model and every batch live on `torch_device` (the backend's GPU on real
hardware). It calls `session.step(trace)` once per training step (the twin charges it; real
hardware ignores it) and meters two windows: "train" (the optimisation steps only: what
`energy_j` and `time_s` mean on every backend) and "eval"; model build is neither. Window edges
wait for the GPU (synchronize), so queued work is charged to the window that queued it.
`profile_only` is the twin's profile-only job: the same batches are planned and charged, nothing is computed.
`job/run.py` chooses between them for a metered job.

Training and evaluation draw a tqdm bar on stderr while stderr is a terminal (`progress=None`, the sweep's rule in
`mlops/sweep/progress.py`), never on stdout, so a command's `--json` output stays JSON; the bar leaves no line
behind (a command prints its own summary), and nested under a sweep's bar it takes the next row.

A causal-LM task (the instruct task) trains the model's LM head with the
loss on response tokens only (labels -100 on the prompt and padding) and reports next-token
accuracy on the response tokens (`eval_token_accuracy`) and their mean cross-entropy (`eval_loss`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.hw.placement import synchronize
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec
from dvfs_mlops.job.workloads.tokenizer import IGNORE_INDEX, Encoded, collate, lm_labels, padded_length

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from dvfs_mlops.hw.device import FreqSession
    from dvfs_mlops.hw.twin.trace import StepTrace
    from dvfs_mlops.job.workloads.prepare import PreparedWorkload

# --precision -> the torch dtype's name: what autocast computes in, and what the twin's step trace records
# (the twin charges tensor-core rates for 16-bit matmuls).
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    steps: int = 50
    epochs: float | None = None  # overrides steps when set
    batch_size: int = 16
    learning_rate: float = 1e-3  # random-init small models want a high rate; pretrained ~5e-5
    weight_decay: float = 0.01
    warmup_share: float = 0.1
    seed: int = 0
    eval_batch_size: int = 64
    attn_implementation: str = "sdpa"  # real training; the twin traces with eager attention
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)
    peft: PeftSpec = FULL  # full fine-tuning, or LoRA (base frozen; adapters and the task head train)
    # The first steps, metered apart as the window "warmup" (allocation, autotuning, lazy loading land there, not on
    # the clock a sweep happens to visit first): at most a quarter of the steps (`cold_steps`). Not the LR warm-up.
    warmup_steps: int = 0

    @property
    def trace_dtype(self) -> str:
        return PRECISIONS[self.precision]

    def cold_steps(self, steps: int) -> int:
        """The warm-up steps of a job of `steps` steps (`cold_steps`)."""
        return cold_steps(self.warmup_steps, steps)


def cold_steps(warmup_steps: int, steps: int) -> int:
    """The warm-up steps a job of `steps` steps meters apart: `warmup_steps`, never more than a quarter of them."""
    return max(0, min(warmup_steps, steps // 4))


@dataclasses.dataclass
class FinetuneResult:
    steps: int
    train_samples: int
    train_loss: float | None  # mean over the last 10 % of steps
    eval_metric: str
    eval_value: float | None  # None when profile-only
    padded_lengths: list[int]  # per step: what the twin replays at other clocks
    wall_time_s: float
    model: Any = dataclasses.field(default=None, repr=False)
    extra_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. eval_loss of a causal-LM task
    warmup_steps: int = 0  # of `steps`, metered apart (window "warmup"); the "train" window is the rest

    @property
    def metered_samples(self) -> int:
        """The examples of the steps after warm-up: what `energy_j` and `time_s` cover."""
        return self.train_samples * (self.steps - self.warmup_steps) // max(1, self.steps)


def num_steps(config: FinetuneConfig, n_train: int) -> int:
    if config.epochs is not None:
        return max(1, math.ceil(config.epochs * n_train / config.batch_size))
    return config.steps


def plan_batches(n_train: int, steps: int, batch_size: int, seed: int) -> list[np.ndarray]:
    """Index batches for `steps` steps: reshuffled each epoch, always full."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    batches = []
    for _ in range(steps):
        while len(order) < batch_size:
            order.extend(rng.permutation(n_train).tolist())
        batches.append(np.asarray(order[:batch_size]))
        order = order[batch_size:]
    return batches


def build_model(config: PretrainedConfig, seed: int, attn: str = "sdpa", pretrained: str | None = None,
                task_kind: str = "classification", peft: PeftSpec = FULL) -> torch.nn.Module:
    """The model a task trains (the one place the auto class is chosen): a sequence classifier, or for a causal-LM
    task the causal LM with its LM head; adapted as `peft` says (LoRA wraps it, full fine-tuning leaves it)."""
    import torch

    from dvfs_mlops.job.workloads.features import auto_model_class

    auto = auto_model_class(task_kind)
    torch.manual_seed(seed)
    if pretrained:
        from dvfs_mlops.job.workloads.hub import pretrained_offline_unless_reachable

        with pretrained_offline_unless_reachable(pretrained) as hub_options:
            model = auto.from_pretrained(pretrained, config=config, attn_implementation=attn, **hub_options)
    else:
        model = auto.from_config(config, attn_implementation=attn)
    return peft.apply(model, str(getattr(config, "model_type", "")), task_kind)


def finetune(workload: PreparedWorkload, config: FinetuneConfig, *, session: FreqSession | None = None,
             trace_for: Callable[[int], StepTrace | None] | None = None,
             torch_device: str = "cpu", on_step: Callable[[int, float | None], None] | None = None,
             pretrained: str | None = None, progress: bool | None = None) -> FinetuneResult:
    """Fine-tune a prepared workload on `torch_device` and evaluate it on its dev split.

    Args:
        workload: a `PreparedWorkload` (its data, tokenizer and model config are loaded here if they were not).
        config: steps (or epochs), batch size, learning rate, seed, precision, LoRA.
        session: an open `FreqSession` metering the windows "train" and "eval" (None: no metering).
        trace_for: padded length -> the twin's step trace, charged once per step (the twin's sessions only).
        torch_device: where the model and every batch live.
        on_step: called after each step with (step, loss) (probe-and-refine moves the clock from here).
        pretrained: load these weights (a hub name or a folder) instead of a random init.
        progress: draw progress bars for the steps and the evaluation on stderr (None: while stderr is a terminal).

    Returns:
        The `FinetuneResult`: steps, loss, the evaluation metric, the padded length of every step, the model.
    """
    train, dev, task = workload.train, workload.dev, workload.task
    causal, is_regression, pad_id, model_config = task.causal_lm, task.is_regression, workload.pad_id, workload.model_config
    metric = task.metric
    steps = num_steps(config, len(train))
    batches = plan_batches(len(train), steps, config.batch_size, config.seed)
    lengths = [padded_length([len(train.ids[i]) for i in b]) for b in batches]

    import torch

    torch.manual_seed(config.seed)
    model = build_model(model_config, config.seed, config.attn_implementation, pretrained, task.kind, config.peft).to(torch_device)
    amp = _autocast(torch_device, config.precision)
    scaler = torch.amp.GradScaler(torch.device(torch_device).type, enabled=config.precision == "fp16")
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: frozen weights get no optimizer state
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    warmup = max(1, int(config.warmup_share * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / max(1, steps - warmup)) if s >= warmup else (s + 1) / warmup
    )
    label_dtype = torch.float32 if is_regression else torch.long
    losses: list[float] = []
    cold = config.cold_steps(steps)
    with StepWindows(session, torch_device, cold) as windows, progress_bar(steps, f"fine-tune {workload.name}", progress) as bar:
        t_train = time.monotonic()
        for step, (idx, n) in enumerate(zip(batches, lengths)):
            ids, mask = collate([train.ids[i] for i in idx], pad_id)
            if causal:
                labels = torch.from_numpy(_lm_batch_labels(train, idx, ids.shape[1])).to(torch_device)
            else:
                labels = torch.as_tensor(train.labels[idx], dtype=label_dtype).to(torch_device)
            with amp():
                out = model(input_ids=torch.from_numpy(ids).to(torch_device), attention_mask=torch.from_numpy(mask).to(torch_device),
                            labels=labels)
            scaler.scale(out.loss).backward()  # a pass-through unless fp16
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss = float(out.loss.detach())  # .item() waits for the step's GPU work: the step boundary
            losses.append(loss)
            _charge(session, trace_for, n)
            if on_step is not None:
                on_step(step, loss)
            windows.step_done(step)
            bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
            bar.update(1)
        synchronize(torch_device)
        wall = time.monotonic() - t_train
    tail = losses[-max(1, len(losses) // 10):]
    extra: dict[str, float] = {}
    with metered(session, "eval", torch_device):
        with amp():
            if causal:  # vocabulary-wide logits: batches of the training size, not eval_batch_size
                value, extra["eval_loss"] = evaluate_lm(model, dev, pad_id, min(config.eval_batch_size, config.batch_size), torch_device,
                                                        progress=progress)
            else:
                value = evaluate(model, dev, pad_id, is_regression, config.eval_batch_size, torch_device, progress=progress)
    return FinetuneResult(steps, steps * config.batch_size, float(np.mean(tail)), metric, value, lengths, wall, model, extra, cold)


def _lm_batch_labels(data: Encoded, idx: np.ndarray, width: int) -> np.ndarray:
    if data.response_start is None:
        raise ValueError("a causal-LM task's split needs response_start (encode it with TextEncoder.encode_lm)")
    return lm_labels([data.ids[i] for i in idx], [data.response_start[i] for i in idx], width)


def profile_only(train_lengths: list[int], config: FinetuneConfig, metric: str, *, session: FreqSession | None = None,
                 trace_for: Callable[[int], StepTrace | None] | None = None, on_step: Callable[[int, float | None], None] | None = None,
                 torch_device: str = "cpu") -> FinetuneResult:
    """The twin's profile-only job: the batches `finetune` would train, planned from the examples' token lengths and
    charged step by step, nothing computed (`metric` names the evaluation that is not run). It needs no data,
    tokenizer, model config or torch: a warm sweep of profile-only points imports none of them."""
    steps = num_steps(config, len(train_lengths))
    batches = plan_batches(len(train_lengths), steps, config.batch_size, config.seed)
    lengths = [padded_length([train_lengths[i] for i in b]) for b in batches]
    t0 = time.monotonic()
    cold = config.cold_steps(steps)
    with StepWindows(session, torch_device, cold) as windows:
        for step, n in enumerate(lengths):
            _charge(session, trace_for, n)
            if on_step is not None:
                on_step(step, None)
            windows.step_done(step)
    return FinetuneResult(steps, steps * config.batch_size, None, metric, None, lengths, time.monotonic() - t0, warmup_steps=cold)


def progress_bar(total: int, desc: str, show: bool | None = None, unit: str = "step") -> Any:
    """A tqdm bar of `total` items on stderr that leaves no line behind when closed (use it as a context manager).

    Args:
        total: the items the bar counts.
        desc: what it counts, shown before the bar.
        show: draw it (None: only while stderr is a terminal; otherwise the bar is tqdm's no-op).
        unit: the items' name.
    """
    from tqdm import tqdm

    visible = sys.stderr.isatty() if show is None else show
    return tqdm(total=total, desc=desc, unit=unit, disable=not visible, leave=False, dynamic_ncols=True, mininterval=0.5,
                file=sys.stderr)


class StepWindows:
    """The windows of a job's training steps: the first `warmup` steps as "warmup", the rest as "train" (what
    `energy_j` and `time_s` mean everywhere). Each edge waits for the GPU. Without a session it only counts.

    Use: `with StepWindows(session, device, warmup) as w:` and `w.step_done(step)` after every step.
    """

    def __init__(self, session: FreqSession | None, torch_device: str, warmup: int):
        self.session = session if hasattr(session, "begin_window") else None
        self.torch_device, self.warmup = torch_device, warmup
        self._open: str | None = None

    def _begin(self, name: str) -> None:
        if self.session is not None:
            synchronize(self.torch_device)
            self.session.begin_window(name)
            self._open = name

    def _end(self) -> None:
        if self.session is not None and self._open is not None:
            synchronize(self.torch_device)
            self.session.end_window(self._open)
            self._open = None

    def __enter__(self) -> StepWindows:
        self._begin("warmup" if self.warmup > 0 else "train")
        return self

    def step_done(self, step: int) -> None:
        """After step `step` (0-based): the warm-up's last step closes "warmup" and opens "train"."""
        if step + 1 == self.warmup:
            self._end()
            self._begin("train")

    def __exit__(self, *exc: object) -> None:
        self._end()


@contextlib.contextmanager
def metered(session: FreqSession | None, name: str, torch_device: str = "cpu") -> Iterator[None]:
    """Meter the block as the session's window `name` (no session, or one without windows: just run it)."""
    window = getattr(session, "window", None)
    if window is None:
        yield
        return
    synchronize(torch_device)
    with window(name):
        yield
        synchronize(torch_device)


def _autocast(torch_device: str, precision: str) -> Callable[[], Any]:
    """A context factory: autocast to the precision's dtype on the device, or nothing for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext
    import torch

    dtype = getattr(torch, PRECISIONS[precision])
    return lambda: torch.autocast(device_type=torch.device(torch_device).type, dtype=dtype)


def _charge(session: FreqSession | None, trace_for: Callable[[int], StepTrace | None] | None, padded: int) -> None:
    if session is not None:
        session.step(trace_for(padded) if trace_for is not None else None)


def evaluate(model: torch.nn.Module, dev: Encoded, pad_id: int, is_regression: bool, batch_size: int = 64, torch_device: str | None = None,
             progress: bool | None = None) -> float:
    """Accuracy, or Pearson correlation for regression, on the dev split (on the model's device); a bar of its batches
    as `progress_bar` shows one."""
    import torch

    where = torch_device or next(model.parameters()).device
    model.eval()
    preds: list[np.ndarray] = []
    with torch.no_grad(), progress_bar(-(-len(dev) // batch_size), "evaluate", progress, unit="batch") as bar:
        for start in range(0, len(dev), batch_size):
            ids, mask = collate(dev.ids[start:start + batch_size], pad_id)
            logits = model(input_ids=torch.from_numpy(ids).to(where), attention_mask=torch.from_numpy(mask).to(where)).logits.float()
            out = logits.squeeze(-1) if is_regression else logits.argmax(-1)
            preds.append(out.float().cpu().numpy() if is_regression else out.cpu().numpy())
            bar.update(1)
    model.train()
    p = np.concatenate(preds)
    if is_regression:
        if np.std(p) == 0 or np.std(dev.labels) == 0:
            return 0.0
        return float(np.corrcoef(p, dev.labels)[0, 1])
    return float((p == dev.labels).mean())


def evaluate_lm(model: torch.nn.Module, dev: Encoded, pad_id: int, batch_size: int = 16, torch_device: str | None = None,
                progress: bool | None = None) -> tuple[float, float]:
    """(next-token accuracy, mean cross-entropy) over the dev split's response tokens (the end token included); a bar
    of its batches as `progress_bar` shows one."""
    import torch

    where = torch_device or next(model.parameters()).device
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad(), progress_bar(-(-len(dev) // batch_size), "evaluate", progress, unit="batch") as bar:
        for start in range(0, len(dev), batch_size):
            idx = np.arange(start, min(start + batch_size, len(dev)))
            ids, mask = collate([dev.ids[i] for i in idx], pad_id)
            labels = torch.from_numpy(_lm_batch_labels(dev, idx, ids.shape[1])).to(where)
            logits = model(input_ids=torch.from_numpy(ids).to(where), attention_mask=torch.from_numpy(mask).to(where)).logits.float()
            logits, target = logits[:, :-1], labels[:, 1:]  # position t predicts token t + 1
            keep = target != IGNORE_INDEX
            correct += int((logits.argmax(-1)[keep] == target[keep]).sum())
            total += int(keep.sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum"))
            bar.update(1)
    model.train()
    if total == 0:
        return 0.0, 0.0
    return correct / total, loss_sum / total
