"""What the governor sees of a fine-tuning job: its features (`WorkloadFeatures`, the one list of input columns) and
how a workload's name carries its variant. Standard library only.

Each feature is declared once, as a field of `WorkloadFeatures` with its unit, its meaning and where a run records
it (`feature`): the runs' params and metrics (`mlops.records`), the dataset read back from them (`mlops.dataset`), the
pyfunc's input signature (`mlops.pyfunc`), the decision tree's numeric columns (`NUMERIC_FEATURES`) and the docs'
table of logged fields (`mlops.fields.markdown_table`) all come from these fields.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The study's size split: results are reported for models <= 70M and > 70M parameters.
SMALL_MODEL_PARAMS = 70_000_000
PARAM, METRIC = "param", "metric"  # where a run records a feature: a param, or a metric of its maxn point


def feature(unit: str, meaning: str, *, recorded: str = PARAM, default: Any = dataclasses.MISSING) -> Any:
    """A feature's declaration (a dataclass field of `WorkloadFeatures`).

    Args:
        unit: its unit ('' for a count or a name).
        meaning: one line: what it is.
        recorded: where a point run records it: `PARAM` (the job's own), or `METRIC` (measured; the feature is the
            mean over the workload's maxn points).
        default: the value a row from before the feature existed means (a feature with one is optional in the
            pyfunc's signature).
    """
    return dataclasses.field(default=default, metadata={"unit": unit, "meaning": meaning, "recorded": recorded})


@dataclasses.dataclass(frozen=True)
class WorkloadFeatures:
    """A fine-tuning job as the governor sees it."""

    model_type: str = feature("", "encoder or decoder (the tree sees is_decoder, 0/1)")
    num_layers: int = feature("", "transformer layers")
    hidden_size: int = feature("", "hidden width")
    num_params: int = feature("", "parameters of the model trained (a LoRA model's frozen base)")
    avg_seq_len: float = feature("tokens", "mean unpadded length of the training examples")
    gpu_util_pct: float | None = feature("%", "GPU utilisation at maxn (None until measured)", recorded=METRIC)
    trainable_params: int | None = feature("", "parameters that get gradients and optimizer state (None: all of them)",
                                           default=None)
    precision: str = feature("", "fp32, bf16 or fp16 (the tree sees half_precision, 0/1)", default="fp32")

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

    @classmethod
    def from_config(cls, config: PretrainedConfig, *, model_type: str, num_params: int, avg_seq_len: float, **more: Any) -> WorkloadFeatures:
        """The features of a model from its transformers config (read by attribute: no transformers needed), what it is
        (`model_type`: encoder or decoder), its parameter count and its data; `more` are the other features
        (trainable_params, precision, gpu_util_pct).

        Raises:
            ValueError: the config has no layer count or hidden size.
        """
        layers = next((getattr(config, k) for k in ("num_hidden_layers", "n_layer", "num_layers") if getattr(config, k, None)), None)
        hidden = next((getattr(config, k) for k in ("hidden_size", "d_model", "n_embd") if getattr(config, k, None)), None)
        if layers is None or hidden is None:
            raise ValueError(f"{type(config).__name__} has no layer count or hidden size")
        return cls(model_type=model_type, num_layers=int(layers), hidden_size=int(hidden), num_params=int(num_params),
                   avg_seq_len=float(avg_seq_len), **{"gpu_util_pct": None, **more})


# The one list of governor input columns (the pyfunc signature, policy.json features, the docs).
FEATURE_COLUMNS = tuple(f.name for f in dataclasses.fields(WorkloadFeatures))
# The same columns as numbers for a decision tree: model_type becomes is_decoder (1.0 for a decoder), precision becomes
# half_precision (1.0 for bf16/fp16: tensor-core rates, half the bytes).
_NUMERIC_NAME = {"model_type": "is_decoder", "precision": "half_precision"}
NUMERIC_FEATURES = tuple(_NUMERIC_NAME.get(c, c) for c in FEATURE_COLUMNS)


def feature_types() -> dict[str, type]:
    """Each feature's type (str, int, float; an optional one's non-None type), by name."""
    hints = typing.get_type_hints(WorkloadFeatures)
    return {name: next(t for t in typing.get_args(hint) or (hint,) if t is not type(None)) for name, hint in hints.items()}


def split_variant(task_part: str) -> tuple[str, str]:
    """`sst2+lora-r8a16+bf16` -> ("sst2", "+lora-r8a16+bf16"): a workload name's task and its variant."""
    task, sep, rest = task_part.partition("+")
    return task, (sep + rest) if sep else ""
