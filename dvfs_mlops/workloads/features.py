"""`WorkloadFeatures`: what the governor sees of a fine-tuning job (DESIGN §5)."""
from __future__ import annotations

import dataclasses
from typing import Any

# The study's size split: results are reported for models <= 70M and > 70M parameters.
SMALL_MODEL_PARAMS = 70_000_000
# The one list of governor input columns (the pyfunc signature, policy.json features, the docs).
FEATURE_COLUMNS = ("model_type", "num_layers", "hidden_size", "num_params", "avg_seq_len", "gpu_util_pct")
# The same columns as numbers for a decision tree: model_type becomes is_decoder (1.0 for a decoder).
NUMERIC_FEATURES = tuple("is_decoder" if c == "model_type" else c for c in FEATURE_COLUMNS)


@dataclasses.dataclass(frozen=True)
class WorkloadFeatures:
    model_type: str  # encoder | decoder
    num_layers: int
    hidden_size: int
    num_params: int
    avg_seq_len: float  # mean unpadded token length of the training set
    gpu_util_pct: float | None  # measured at maxn (None until measured)

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def numeric_row(self) -> dict[str, float]:
        """NUMERIC_FEATURES -> value; an unmeasured gpu_util_pct counts as 0."""
        row = self.as_row()
        out = {c: float(row[c] or 0.0) for c in FEATURE_COLUMNS if c != "model_type"}
        return {"is_decoder": 1.0 if self.model_type == "decoder" else 0.0, **out}

    def with_gpu_util(self, pct: float | None) -> WorkloadFeatures:
        return dataclasses.replace(self, gpu_util_pct=pct)


def classifier_config(spec: Any, num_labels: int, pad_id: int | None = None) -> Any:
    """The model config actually trained: the preset's, with the task's head and our pad id."""
    cfg = type(spec.config).from_dict(spec.config.to_dict())
    cfg.num_labels = num_labels
    if num_labels == 1:
        cfg.problem_type = "regression"
    if pad_id is not None:
        cfg.pad_token_id = pad_id
    elif getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0
    return cfg


def count_params(config: Any) -> int:
    """Trainable parameters of the sequence classifier, counted on `meta` (no memory)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def workload_features(spec: Any, config: Any, avg_seq_len: float, gpu_util_pct: float | None = None) -> WorkloadFeatures:
    return WorkloadFeatures(spec.model_type, spec.num_layers, spec.hidden_size, count_params(config), float(avg_seq_len), gpu_util_pct)
