"""What `DvfsCallback` reads of a user's `Trainer` job: the workload's features from the live model and its data, the
precision from the Trainer's arguments, the twin's step trace, and whether the model sits on the board's GPU."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.model.workload import WorkloadFeatures

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, TrainingArguments

    from dvfs_mlops.hw.board import Board
    from dvfs_mlops.hw.device import Device
    from dvfs_mlops.hw.twin.trace import StepTrace


def dataset_avg_len(dataset: Any, limit: int = 2000) -> float | None:
    """Mean unpadded length of the first `limit` training examples (input_ids / attention_mask); None where the data
    has neither."""
    if dataset is None:
        return None
    total, n = 0, 0
    try:
        for i in range(min(limit, len(dataset))):
            item = dataset[i]
            if "attention_mask" in item:
                total += int(sum(int(x) for x in item["attention_mask"]))
            elif "input_ids" in item:
                total += len(item["input_ids"])
            else:
                return None
            n += 1
    except (TypeError, KeyError, IndexError):
        return None
    return total / n if n else None


def precision_of(args: TrainingArguments) -> str:
    """fp32, bf16 or fp16, as `TrainingArguments(bf16=True)` / `fp16=True` train."""
    return "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"


def features_of(model: PreTrainedModel, dataset: Any, precision: str, avg_seq_len: float | None = None,
                gpu_util_pct: float | None = None) -> WorkloadFeatures:
    """The features of the model the Trainer trains: a peft-wrapped (LoRA) model's frozen base is `num_params` and
    what trains is `trainable_params`.

    Raises:
        DvfsError: the config has no layer count or hidden size, or `avg_seq_len` is not given and the data has no
            input_ids/attention_mask.
    """
    from dvfs_mlops.job.workloads.adapters import count_base, count_trainable, peft_of
    from dvfs_mlops.job.workloads.zoo import ENCODER_TYPES

    avg = avg_seq_len or dataset_avg_len(dataset)
    if avg is None:
        raise DvfsError("cannot compute avg_seq_len from the training data (no input_ids/attention_mask); pass DvfsCallback(avg_seq_len=...)")
    trainable = count_trainable(model)
    kind = "encoder" if getattr(model.config, "model_type", "") in ENCODER_TYPES else "decoder"
    try:
        return WorkloadFeatures.from_config(model.config, model_type=kind, avg_seq_len=avg, trainable_params=int(trainable),
                                            num_params=count_base(model) if peft_of(model).is_lora else trainable,
                                            gpu_util_pct=gpu_util_pct, precision=precision)
    except ValueError as e:
        raise DvfsError(f"cannot compute the governor's features: {e}") from None


def twin_trace(model: PreTrainedModel, batch_size: int, avg_len: float, precision: str) -> StepTrace:
    """The twin's step trace of this model at the padded length of an average batch (an LM head traced as one)."""
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.finetune import PRECISIONS
    from dvfs_mlops.job.workloads.adapters import peft_of

    padded = max(8, -(-int(round(avg_len)) // 8) * 8)
    kind = "causal_lm" if type(model).__name__.endswith("ForCausalLM") else "classification"
    return TraceCache().get(model.config, batch_size, padded, PRECISIONS[precision], int(getattr(model.config, "num_labels", 2)),
                            peft_of(model), kind=kind)


def model_device(model: torch.nn.Module | None) -> str | None:
    """The torch device the model's parameters are on; None for a model without parameters."""
    try:
        return str(next(model.parameters()).device)  # type: ignore[union-attr]  # None: the AttributeError below
    except (StopIteration, AttributeError, TypeError):
        return None


def model_uuid(model: torch.nn.Module | None, torch_device: str | None) -> str | None:
    """The UUID torch reports for the CUDA device the model is on; None off CUDA or where a torch device was named."""
    from dvfs_mlops.hw.placement import cuda_uuid

    actual = model_device(model)
    if actual is None or not actual.startswith("cuda") or torch_device or settings.torch_device_override():
        return None
    return cuda_uuid(actual)


def check_placement(model: torch.nn.Module, device: Device, board: Board, torch_device: str | None) -> None:
    """The model must sit on the board's GPU: a clock pinned on a GPU that does not train saves nothing.

    The device type must match; on nvml the CUDA device the model is on must also be the board's GPU, told by UUID
    (`placement.cuda_uuid`: torch's UUID of that device, against the GPU's own and its MIG devices'), since a CUDA
    index says nothing of which NVML GPU it is. A `torch_device` the caller named (or $DVFS_TORCH_DEVICE) is taken as
    meant.

    Raises:
        TorchDeviceError: the model is on another device type, or another NVML GPU.
    """
    from dvfs_mlops.hw.placement import TorchDeviceError, bare_uuid, cuda_uuid

    wanted, actual = board.torch_device, model_device(model)
    if actual is None:
        return
    if wanted.split(":")[0] != actual.split(":")[0]:
        raise TorchDeviceError(f"the model is on {actual} but the {board.backend} backend meters {wanted}: the clock would "
                               f"be pinned on a GPU that does not train; let Trainer place the model (TrainingArguments "
                               f"use_cpu=False) or pass DvfsCallback(torch_device={actual!r}) on purpose")
    if board.backend != "nvml" or not actual.startswith("cuda") or torch_device or settings.torch_device_override():
        return
    ours = set(getattr(device, "cuda_uuids", None) or {bare_uuid(board.device_id)})
    found = cuda_uuid(actual)
    if (found in ours) if found is not None else actual == wanted:  # no UUID from torch: the resolved device itself
        return
    raise TorchDeviceError(f"the model is on {actual} ({found or 'UUID unknown'}) but the nvml backend pins and meters "
                           f"{board.device_id} ({wanted}): the clock would be pinned on a GPU that does not train; "
                           f"let Trainer put the model on {wanted} (CUDA_VISIBLE_DEVICES, LOCAL_RANK), open the GPU it "
                           f"trains on (--gpu-index), or pass DvfsCallback(torch_device={actual!r}) on purpose")
