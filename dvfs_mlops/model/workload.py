"""What the governor sees of a fine-tuning job: its features (`WorkloadFeatures`, the one list of input columns) and
how a workload's name carries its variant. Standard library only."""
from __future__ import annotations

import dataclasses
from typing import Any

# The study's size split: results are reported for models <= 70M and > 70M parameters.
SMALL_MODEL_PARAMS = 70_000_000
# The one list of governor input columns (the pyfunc signature, policy.json features, the docs).
# trainable_params and precision came later: a row without them is a full fine-tune in fp32 (policy_tree.feature_value).
FEATURE_COLUMNS = ("model_type", "num_layers", "hidden_size", "num_params", "avg_seq_len", "gpu_util_pct", "trainable_params",
                   "precision")
# The same columns as numbers for a decision tree: model_type becomes is_decoder (1.0 for a decoder), precision becomes
# half_precision (1.0 for bf16/fp16: tensor-core rates, half the bytes).
_NUMERIC_NAME = {"model_type": "is_decoder", "precision": "half_precision"}
NUMERIC_FEATURES = tuple(_NUMERIC_NAME.get(c, c) for c in FEATURE_COLUMNS)


@dataclasses.dataclass(frozen=True)
class WorkloadFeatures:
    model_type: str  # encoder | decoder
    num_layers: int
    hidden_size: int
    num_params: int
    avg_seq_len: float  # mean unpadded token length of the training set
    gpu_util_pct: float | None  # measured at maxn (None until measured)
    trainable_params: int | None = None  # parameters that get gradients and optimizer state (None: all, a full fine-tune)
    precision: str = "fp32"  # fp32 | bf16 | fp16

    def __post_init__(self) -> None:
        if self.trainable_params is None:
            object.__setattr__(self, "trainable_params", self.num_params)

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def numeric_row(self) -> dict[str, float]:
        """NUMERIC_FEATURES -> value; an unmeasured gpu_util_pct counts as 0."""
        row = self.as_row()
        out = {c: float(row[c] or 0.0) for c in FEATURE_COLUMNS if c not in _NUMERIC_NAME}
        return {"is_decoder": 1.0 if self.model_type == "decoder" else 0.0, **out,
                "half_precision": 0.0 if self.precision == "fp32" else 1.0}

    def with_gpu_util(self, pct: float | None) -> WorkloadFeatures:
        return dataclasses.replace(self, gpu_util_pct=pct)


def split_variant(task_part: str) -> tuple[str, str]:
    """`sst2+lora-r8a16+bf16` -> ("sst2", "+lora-r8a16+bf16"): a workload name's task and its variant."""
    task, sep, rest = task_part.partition("+")
    return task, (sep + rest) if sep else ""
