"""A model's facts as the governor sees them (layers, hidden size, parameter counts), from its config: counted once on
the `meta` device and cached. The feature schema itself is `model.workload`."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.model.workload import WorkloadFeatures

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from dvfs_mlops.job.workloads.adapters import PeftSpec
    from dvfs_mlops.job.workloads.zoo import ModelSpec


def classifier_config(spec: ModelSpec, num_labels: int, pad_id: int | None = None,
                      task_kind: str = "classification") -> PretrainedConfig:
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


def count_params(config: PretrainedConfig, task_kind: str = "classification", peft: PeftSpec | None = None) -> tuple[int, int]:
    """(all parameters, the trainable ones) of the model trained (sequence classifier, or causal LM), counted on `meta`
    (no memory); with a LoRA `peft` (workloads/adapters.PeftSpec) the base is frozen and the adapters (and a
    classifier's head) train."""
    import torch

    from dvfs_mlops.job.workloads.adapters import FULL, apply_peft, count_trainable

    auto = auto_model_class(task_kind)
    try:
        with torch.device("meta"):
            model = auto.from_config(config)
            base = count_trainable(model)
            model = apply_peft(model, peft or FULL, str(getattr(config, "model_type", "")), task_kind)
    except ValueError as e:  # transformers: "Unrecognized configuration class ... for this kind of AutoModel"
        if task_kind != "causal_lm":
            raise
        raise no_causal_lm_error(config, e) from None
    return base, count_trainable(model)


def no_causal_lm_error(config: PretrainedConfig, e: Exception) -> DvfsError:
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
    trainable_params: int | None = None  # None: all of them (full fine-tuning)


def facts_key(spec: ModelSpec, num_labels: int, task_kind: str = "classification", peft: PeftSpec | None = None) -> str | None:
    """The cache key of a model's facts: the config's fingerprint, the head (its size and the task kind), the adaptation,
    the code and libraries that count."""
    fp = spec.fingerprint
    if fp is None:
        return None
    from dvfs_mlops.job.workloads.cache import code_digest, digest, dist_version

    what: dict[str, Any] = {"model": fp, "num_labels": int(num_labels), "kind": task_kind, "torch": dist_version("torch"),
                            "code": code_digest("job.workloads.features", "job.workloads.zoo")}
    if peft is not None and peft.is_lora:  # only LoRA adds to the key: a full fine-tune's does not depend on peft
        what.update(peft=peft.definition(), peft_version=dist_version("peft"), peft_code=code_digest("job.workloads.adapters"))
    return digest(what)


def compute_model_facts(spec: ModelSpec, num_labels: int, pad_id: int | None = None, task_kind: str = "classification",
                        peft: PeftSpec | None = None) -> ModelFacts:
    """The slow way: build the config with transformers and count the trained model's parameters on meta."""
    total, trainable = count_params(classifier_config(spec, num_labels, pad_id, task_kind), task_kind, peft)
    return ModelFacts(spec.model_type, spec.num_layers, spec.hidden_size, total, trainable)


def model_facts(spec: ModelSpec, num_labels: int, pad_id: int | None = None, *, use_cache: bool = True,
                task_kind: str = "classification", peft: PeftSpec | None = None) -> ModelFacts:
    """A model's facts, from the on-disk cache when this config was counted before (no torch, no transformers).

    The pad id changes no parameter count, so it is not part of the key.
    """
    from dvfs_mlops.job.workloads import cache

    key = facts_key(spec, num_labels, task_kind, peft) if use_cache else None
    if key is not None:
        hit = cache.read("models", key)
        if hit is not None:
            try:
                trainable = hit.get("trainable_params")
                return ModelFacts(str(hit["model_type"]), int(hit["num_layers"]), int(hit["hidden_size"]), int(hit["num_params"]),
                                  None if trainable is None else int(trainable))
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # a malformed entry is counted again
    facts = compute_model_facts(spec, num_labels, pad_id, task_kind, peft)
    if key is not None:
        cache.write("models", key, dataclasses.asdict(facts), described={"model": spec.name, "num_labels": num_labels, "kind": task_kind})
    return facts


def features_from_facts(facts: ModelFacts, avg_seq_len: float, gpu_util_pct: float | None = None,
                        precision: str = "fp32") -> WorkloadFeatures:
    return WorkloadFeatures(facts.model_type, facts.num_layers, facts.hidden_size, facts.num_params, float(avg_seq_len), gpu_util_pct,
                            facts.trainable_params, precision)
