"""Capture the kernel sequence of one training step, shapes only, on the `meta` device (`StepTrace`), or describe a step
by its aggregate work where no trace exists (`StepWork`).

A `TorchDispatchMode` sees every aten op of forward, backward and the optimizer step. Per op we
keep what the twin needs to time it on a GPU: FLOPs (torch's own formulas, `flop_registry`, called
with `out_val=`; elementwise ops get one FLOP per output element), bytes read + written, and
whether it launches a kernel at all (views and allocations only cost host time). On `meta` no
memory is allocated and nothing is computed, so a pythia-1b trace costs seconds on a laptop.

Eager attention is forced for the capture: SDPA hides its matmuls from the FLOP counter.
AdamW(fused=True) is refused on meta, so the optimizer is modelled as CUDA training would run it:
one fused kernel moving 7x the parameter bytes (read param, grad, two moments; write param, two
moments).

A causal-LM task (`kind="causal_lm"`) traces the model's LM head instead of a classifier: labels of
shape [batch, seq], so the vocabulary-wide logits and their cross-entropy are in the step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import PretrainedConfig

TRACE_FORMAT = 2
KIND_VIEW, KIND_KERNEL = 0, 1
# Ops that allocate or describe memory without launching a kernel.
_NO_KERNEL_PREFIXES = ("empty", "new_empty", "_local_scalar_dense", "sym_", "lift_fresh", "set_")
_ADAMW_FLOPS_PER_PARAM = 12  # fused AdamW arithmetic per element (moments, bias correction, decay)


class Adaptation(Protocol):
    """How a model is adapted for training (the workloads' `PeftSpec`; the twin knows no adapter library)."""

    @property
    def is_lora(self) -> bool: ...

    def definition(self) -> dict[str, Any]: ...

    def apply(self, model: torch.nn.Module, model_type: str, task_kind: str = "classification") -> torch.nn.Module: ...


@dataclasses.dataclass
class StepTrace:
    """The ops of one training step (forward + backward + optimizer), in launch order."""

    key: str
    kinds: np.ndarray  # KIND_VIEW | KIND_KERNEL per op
    flops: np.ndarray  # per op
    bytes: np.ndarray  # per op, read + written
    has_flop_formula: np.ndarray  # bool per op: FLOPs from torch's formulas (matmul-like)
    num_params: int
    batch_size: int
    seq_len: int
    dtype: str

    @property
    def n_kernels(self) -> int:
        return int((self.kinds == KIND_KERNEL).sum())

    @property
    def n_views(self) -> int:
        return int((self.kinds == KIND_VIEW).sum())

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TRACE_FORMAT,
            "key": self.key,
            "kinds": self.kinds.astype(int).tolist(),
            "flops": self.flops.tolist(),
            "bytes": self.bytes.tolist(),
            "has_flop_formula": self.has_flop_formula.astype(int).tolist(),
            "num_params": self.num_params,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepTrace:
        return cls(
            key=d["key"],
            kinds=np.asarray(d["kinds"], dtype=np.int8),
            flops=np.asarray(d["flops"], dtype=np.float64),
            bytes=np.asarray(d["bytes"], dtype=np.float64),
            has_flop_formula=np.asarray(d["has_flop_formula"], dtype=bool),
            num_params=int(d["num_params"]),
            batch_size=int(d["batch_size"]),
            seq_len=int(d["seq_len"]),
            dtype=d["dtype"],
        )


@dataclasses.dataclass(frozen=True)
class StepWork:
    """One training step described by its aggregate work instead of its kernels: what a measured grid without a step
    trace can be fitted to (hw/twin/fit.py `fit_grid`), timed by hw/twin/physics.py `work_grid`.

    Every time is at the top of its clock's table (the twin's `max_mhz`, `cpu_max_mhz`); the traffic is in bytes.

    Attributes:
        key: the workload's name.
        host_serial_s: host time the GPU waits for (per-step overhead: optimizer bookkeeping, Python, data).
        host_dispatch_s: host time that overlaps the GPU's work (launching its kernels).
        gpu_compute_s: the GPU's compute time (it scales as 1 / GPU clock).
        dram_bytes: DRAM traffic (its time is bytes / (eta_memory x bandwidth at the EMC clock)).
        kernel_overlap: how compute and memory time combine, (C^n + M^n)^(1/n): 1 adds them, large n takes the larger
            (a step of kernels each bound by one of the two).
        queue_overlap: the same for host dispatch and the GPU's work: 1 adds them, large n takes the larger (a deep
            launch queue).
    """

    key: str
    host_serial_s: float
    host_dispatch_s: float
    gpu_compute_s: float
    dram_bytes: float
    kernel_overlap: float
    queue_overlap: float

    def to_dict(self) -> dict[str, Any]:
        """The work as YAML-ready numbers (`from_dict` reads it back)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "step work") -> StepWork:
        """A `to_dict` mapping; a missing or unknown name, or a negative or non-numeric value, is a DvfsError naming it."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing, unknown = sorted(set(names) - set(data)), sorted(set(data) - set(names))
        if missing or unknown:
            raise DvfsError(f"{source}: a step's work needs exactly {', '.join(names)}"
                            + (f"; missing {', '.join(missing)}" if missing else "") + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        values: dict[str, Any] = {"key": str(data["key"])}
        for name in names[1:]:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise DvfsError(f"{source}: {name} of {values['key']!r} must be a non-negative number, got {value!r}")
            values[name] = float(value)
        for name in ("kernel_overlap", "queue_overlap"):
            if values[name] < 1:
                raise DvfsError(f"{source}: {name} of {values['key']!r} must be at least 1, got {values[name]!r}")
        return cls(**values)


def _nbytes(t: object) -> int:
    import torch

    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    return 0


def _tensors(tree: object) -> list[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


class _Recorder:
    """The dispatch mode's state, kept apart so the mode class is built lazily (torch import)."""

    def __init__(self) -> None:
        self.kinds: list[int] = []
        self.flops: list[float] = []
        self.bytes: list[float] = []
        self.formula: list[bool] = []

    def record(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object) -> None:
        from torch.utils.flop_counter import flop_registry

        name = func.__name__.split(".")[0]
        if func.is_view or name.startswith(_NO_KERNEL_PREFIXES) or name in ("detach", "alias", "t"):
            self.kinds.append(KIND_VIEW)
            self.flops.append(0.0)
            self.bytes.append(0.0)
            self.formula.append(False)
            return
        outs = _tensors(out)
        moved = sum(_nbytes(t) for t in _tensors((args, kwargs))) + sum(_nbytes(t) for t in outs)
        packet = func.overloadpacket
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
            formula = True
        else:
            flops = float(sum(t.numel() for t in outs))
            formula = False
        self.kinds.append(KIND_KERNEL)
        self.flops.append(flops)
        self.bytes.append(float(moved))
        self.formula.append(formula)


def _make_mode(recorder: _Recorder) -> TorchDispatchMode:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _TraceMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            recorder.record(func, args, kwargs, out)
            return out

    return _TraceMode()


def trace_key(config: PretrainedConfig | Mapping[str, Any], batch_size: int, seq_len: int, dtype: str, num_labels: int,
              peft: Adaptation | None = None,
              kind: str = "classification") -> str:
    """A stable id for a (model config, batch, padded length, dtype, adaptation, head) capture. The adaptation and the
    kind are in the key only for LoRA and a causal LM: a full classifier capture is keyed by its config, batch, length,
    dtype, labels, torch version and trace format alone."""
    import torch

    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for volatile in ("transformers_version", "_name_or_path", "_attn_implementation_autoset", "torch_dtype", "dtype"):
        cfg.pop(volatile, None)
    what: dict[str, Any] = {"cfg": cfg, "b": batch_size, "s": seq_len, "dt": dtype, "nl": num_labels, "torch": torch.__version__,
                            "fmt": TRACE_FORMAT}
    if peft is not None and peft.is_lora:
        what["peft"] = peft.definition()
    if kind == "causal_lm":
        what["kind"] = kind
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def capture_step_trace(config: PretrainedConfig, batch_size: int, seq_len: int, dtype: str = "float32", num_labels: int = 2,
                       peft: Adaptation | None = None, kind: str = "classification") -> StepTrace:
    """Trace one AdamW training step on the meta device: of a sequence-classification model, or (kind="causal_lm")
    of the causal LM with labels on every position, so its LM head and cross-entropy are charged.

    With LoRA (`peft`: anything with `is_lora`, `definition()` and `apply(model, model_type, kind)`, as the workloads'
    PeftSpec; the twin knows no adapter library) the model is wrapped as training wraps it: autograd then computes
    no weight gradient for the frozen base, and the optimizer moves only the adapters' (and a head's) state.
    """
    import torch
    import transformers

    torch_dtype = getattr(torch, dtype)
    key = trace_key(config, batch_size, seq_len, dtype, num_labels, peft, kind)
    cfg = type(config).from_dict(config.to_dict())
    causal = kind == "causal_lm"
    if not causal:
        cfg.num_labels = num_labels
    if getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForSequenceClassification
    with torch.device("meta"):
        model = auto.from_config(cfg, attn_implementation="eager", dtype=torch_dtype)
        if peft is not None and peft.is_lora:
            model = peft.apply(model, str(getattr(cfg, "model_type", "")), kind)
    model.train()
    vocab = int(getattr(cfg, "vocab_size", 30522))
    input_ids = torch.randint(1, max(2, vocab), (batch_size, seq_len), device="meta")
    labels = (torch.randint(0, max(2, vocab), (batch_size, seq_len), device="meta") if causal
              else torch.zeros(batch_size, dtype=torch.long, device="meta"))
    params = [p for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in params)
    param_bytes = sum(_nbytes(p) for p in params)

    recorder = _Recorder()
    with _make_mode(recorder):
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
    # Optimizer: one fused AdamW kernel (CUDA training uses fused=True; meta refuses it).
    recorder.kinds.append(KIND_KERNEL)
    recorder.flops.append(float(_ADAMW_FLOPS_PER_PARAM * num_params))
    recorder.bytes.append(float(7 * param_bytes))
    recorder.formula.append(False)
    return StepTrace(
        key=key,
        kinds=np.asarray(recorder.kinds, dtype=np.int8),
        flops=np.asarray(recorder.flops, dtype=np.float64),
        bytes=np.asarray(recorder.bytes, dtype=np.float64),
        has_flop_formula=np.asarray(recorder.formula, dtype=bool),
        num_params=int(num_params),
        batch_size=batch_size,
        seq_len=seq_len,
        dtype=dtype,
    )


def default_cache_dir() -> Path:
    return settings.trace_cache_dir()


class TraceCache:
    """Step traces on disk, one JSON file per capture key, plus an in-process memo."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()
        self._memo: dict[str, StepTrace] = {}

    def get(self, config: PretrainedConfig, batch_size: int, seq_len: int, dtype: str = "float32", num_labels: int = 2,
            peft: Adaptation | None = None,
            kind: str = "classification") -> StepTrace:
        key = trace_key(config, batch_size, seq_len, dtype, num_labels, peft, kind)
        if key in self._memo:
            return self._memo[key]
        path = self.directory / f"{key}.json"
        trace: StepTrace | None = None
        if path.exists():
            try:
                data = json.loads(path.read_text())
                if data.get("format") == TRACE_FORMAT:
                    trace = StepTrace.from_json(data)
            except (OSError, ValueError, KeyError):
                trace = None  # a corrupt cache entry is re-captured
        if trace is None:
            trace = capture_step_trace(config, batch_size, seq_len, dtype, num_labels, peft, kind)
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(trace.to_json()))
            os.replace(tmp, path)
        self._memo[key] = trace
        return trace
