"""`WorkloadFeatures`: what the governor sees of a fine-tuning job (DESIGN §5)."""
from __future__ import annotations

import dataclasses
from typing import Any

from dvfs_mlops.errors import DvfsError

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


def classifier_config(spec: Any, num_labels: int, pad_id: int | None = None, task_kind: str = "classification") -> Any:
    """The model config actually trained: the preset's, with the task's head and our pad id.

    A causal-LM task (`task_kind="causal_lm"`) trains the model's own LM head: no classification fields are set."""
    cfg = type(spec.config).from_dict(spec.config.to_dict())
    if task_kind != "causal_lm":
        cfg.num_labels = num_labels
        if num_labels == 1:
            cfg.problem_type = "regression"
    if pad_id is not None:
        cfg.pad_token_id = pad_id
    elif getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0
    return cfg


def auto_model_class(task_kind: str = "classification") -> Any:
    """The transformers auto class a task trains: the causal LM for causal_lm tasks, else the sequence classifier."""
    import transformers

    return transformers.AutoModelForCausalLM if task_kind == "causal_lm" else transformers.AutoModelForSequenceClassification


def count_params(config: Any, task_kind: str = "classification") -> int:
    """Trainable parameters of the model trained (sequence classifier, or causal LM), counted on `meta` (no memory)."""
    import torch

    auto = auto_model_class(task_kind)
    try:
        with torch.device("meta"):
            model = auto.from_config(config)
    except ValueError as e:  # transformers: "Unrecognized configuration class ... for this kind of AutoModel"
        if task_kind != "causal_lm":
            raise
        raise no_causal_lm_error(config, e) from None
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def no_causal_lm_error(config: Any, e: Exception) -> DvfsError:
    """The one line for a config transformers has no causal LM for (a causal-LM task cannot train it)."""
    return DvfsError(f"model type {getattr(config, 'model_type', '?')!r} has no causal-LM class in transformers "
                     f"({str(e).splitlines()[0][:120]}); a causal-LM task needs a decoder such as a pythia preset or a Llama/Qwen config")


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the governor sees of a model: computed from its config (and a meta-device count) or read from the cache."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_params: int


def facts_key(spec: Any, num_labels: int, task_kind: str = "classification") -> str | None:
    """The cache key of a model's facts: the config's fingerprint, the head (its size and the task kind), the code and
    libraries that count."""
    fp = spec.fingerprint
    if fp is None:
        return None
    from dvfs_mlops.workloads.cache import code_digest, digest, dist_version

    return digest({"model": fp, "num_labels": int(num_labels), "kind": task_kind, "torch": dist_version("torch"),
                   "code": code_digest("workloads.features", "workloads.zoo")})


def compute_model_facts(spec: Any, num_labels: int, pad_id: int | None = None, task_kind: str = "classification") -> ModelFacts:
    """The slow way: build the config with transformers and count the trained model's parameters on meta."""
    return ModelFacts(spec.model_type, spec.num_layers, spec.hidden_size,
                      count_params(classifier_config(spec, num_labels, pad_id, task_kind), task_kind))


def model_facts(spec: Any, num_labels: int, pad_id: int | None = None, *, use_cache: bool = True,
                task_kind: str = "classification") -> ModelFacts:
    """A model's facts, from the on-disk cache when this config was counted before (no torch, no transformers).

    The pad id changes no parameter count, so it is not part of the key.
    """
    from dvfs_mlops.workloads import cache

    key = facts_key(spec, num_labels, task_kind) if use_cache else None
    if key is not None:
        hit = cache.read("models", key)
        if hit is not None:
            try:
                return ModelFacts(str(hit["model_type"]), int(hit["num_layers"]), int(hit["hidden_size"]), int(hit["num_params"]))
            except (KeyError, TypeError, ValueError):
                pass  # a malformed entry is counted again
    facts = compute_model_facts(spec, num_labels, pad_id, task_kind)
    if key is not None:
        cache.write("models", key, dataclasses.asdict(facts), described={"model": spec.name, "num_labels": num_labels, "kind": task_kind})
    return facts


def workload_features(spec: Any, config: Any, avg_seq_len: float, gpu_util_pct: float | None = None) -> WorkloadFeatures:
    return WorkloadFeatures(spec.model_type, spec.num_layers, spec.hidden_size, count_params(config), float(avg_seq_len), gpu_util_pct)


def features_from_facts(facts: ModelFacts, avg_seq_len: float, gpu_util_pct: float | None = None) -> WorkloadFeatures:
    return WorkloadFeatures(facts.model_type, facts.num_layers, facts.hidden_size, facts.num_params, float(avg_seq_len), gpu_util_pct)
