"""Turn (model, task) names into everything a fine-tuning run needs, once per workload."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from dvfs_mlops.workloads.features import (
    WorkloadFeatures,
    classifier_config,
    workload_features,
)
from dvfs_mlops.workloads.tasks import TaskData, load_task
from dvfs_mlops.workloads.tokenizer import (
    Encoded,
    TextEncoder,
    pretrained_tokenizer,
    train_wordpiece,
    training_texts,
)
from dvfs_mlops.workloads.zoo import ModelSpec, resolve_model


@dataclasses.dataclass
class PreparedWorkload:
    name: str  # "bert-base/rte"
    spec: ModelSpec
    data: TaskData
    encoder: TextEncoder
    train: Encoded
    dev: Encoded
    model_config: Any
    features: WorkloadFeatures

    def trace_provider(self, batch_size: int, dtype: str = "float32") -> Callable[[int], Any]:
        """padded length -> the twin's step trace for this model (cached on disk)."""
        from dvfs_mlops.twin.trace import TraceCache

        cache = TraceCache()
        return lambda n: cache.get(self.model_config, batch_size, n, dtype, self.data.task.num_labels)


def prepare_workload(model: str | None, task: str, *, model_config_path: str | None = None, pretrained: str | None = None,
                     data_source: str = "synthetic", data_dir: str | None = None, seed: int = 0,
                     train_size: int = 2048, dev_size: int = 256, max_length: int = 128) -> PreparedWorkload:
    spec = resolve_model(model, model_config_path, pretrained)
    data = load_task(task, data_source, data_dir, seed, train_size, dev_size)
    encoder = pretrained_tokenizer(pretrained, max_length) if pretrained else train_wordpiece(training_texts(data.train), max_length=max_length)
    label_dtype = np.float32 if data.task.is_regression else np.int64
    train, dev = encoder.encode(data.train, label_dtype), encoder.encode(data.dev, label_dtype)
    config = classifier_config(spec, data.task.num_labels, encoder.pad_id)
    features = workload_features(spec, config, train.mean_length)
    return PreparedWorkload(f"{spec.name}/{task}", spec, data, encoder, train, dev, config, features)
