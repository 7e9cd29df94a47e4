"""Turn (model, task) names into everything a fine-tuning run needs, once per workload.

What a decision needs (the governor's features, the training split's token lengths, the pad id and
the twin's step trace) is read from small on-disk caches when this workload was prepared before
(`workloads/cache.py`), so a warm `finetune --dry-run` imports neither torch nor transformers and
neither generates the data nor trains a tokenizer. The rest (the data, the tokenizer, the encoded
splits, the transformers config) is built on first use; `materialize()` builds it at once, which
the launcher does before any clock is touched. A changed input (task, data source and its files,
tokenizer, split, model config, library versions, the producing code) is a cache miss, and the
slow path both computes and stores the values.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dvfs_mlops.errors import unknown
from dvfs_mlops.job.workloads import cache
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec, variant_suffix
from dvfs_mlops.job.workloads.features import classifier_config, features_from_facts, model_facts
from dvfs_mlops.job.workloads.tasks import SOURCES, TaskData, TaskSpec, get_task, load_task
from dvfs_mlops.job.workloads.tokenizer import (
    Encoded,
    TextEncoder,
    pretrained_tokenizer,
    train_wordpiece,
    training_texts,
)
from dvfs_mlops.job.workloads.zoo import WORDPIECE_VOCAB, ModelSpec, check_scratch_vocab, check_task_model, resolve_model
from dvfs_mlops.model.workload import WorkloadFeatures

if TYPE_CHECKING:
    from dvfs_mlops.hw.twin.trace import StepTrace, TraceCache

log = logging.getLogger(__name__)


MAX_LENGTH = 128  # tokens: every sequence is cut to this (a causal-LM pair keeps half of it for the response)


def mean_length(lengths: list[int]) -> float:
    """The mean unpadded token length, computed as `Encoded.mean_length` computes it."""
    return float(np.mean(lengths)) if lengths else 0.0


@dataclasses.dataclass
class _Loaded:
    data: TaskData
    encoder: TextEncoder
    train: Encoded
    dev: Encoded


class PreparedWorkload:
    """A workload: its features at once, its data, tokenizer and model config on first use."""

    def __init__(self, name: str, spec: ModelSpec, task: TaskSpec, source: str, train_lengths: list[int], pad_id: int,
                 features: WorkloadFeatures, load: Callable[[], _Loaded], loaded: _Loaded | None = None,
                 on_loaded: Callable[[_Loaded], None] | None = None, use_cache: bool = True, peft: PeftSpec = FULL):
        self.name = name  # "bert-base/rte", "qwen2-0.5b/rte+lora-r8a16+bf16"
        self.spec = spec
        self.task = task
        self.source = source
        self.train_lengths = train_lengths  # unpadded token length of each training example
        self.pad_id = pad_id
        self.features = features
        self._load = load
        self._loaded = loaded
        self._on_loaded = on_loaded
        self.use_cache = use_cache
        self.peft = peft  # full fine-tuning or LoRA: what trains, what the twin traces
        self.precision = features.precision  # fp32 | bf16 | fp16: how it trains, what the twin charges
        self._providers: dict[tuple[int, str], Callable[[int], Any]] = {}

    @property
    def data_source(self) -> str:
        """Where the data comes from, as its reader names it (without loading it): synthetic, hub, tsv (GLUE files),
        or jsonl (a causal-LM task's prompt/response files)."""
        return "jsonl" if self.task.causal_lm and self.source == "tsv" else self.source

    @property
    def n_train(self) -> int:
        return len(self.train_lengths)

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def materialize(self) -> PreparedWorkload:
        """Load the data, train (or load) the tokenizer and encode the splits, if not done yet."""
        if self._loaded is None:
            self._loaded = self._load()
            if self._on_loaded is not None:
                self._on_loaded(self._loaded)
        return self

    @property
    def data(self) -> TaskData:
        return self.materialize()._loaded.data  # type: ignore[union-attr]

    @property
    def encoder(self) -> TextEncoder:
        return self.materialize()._loaded.encoder  # type: ignore[union-attr]

    @property
    def train(self) -> Encoded:
        return self.materialize()._loaded.train  # type: ignore[union-attr]

    @property
    def dev(self) -> Encoded:
        return self.materialize()._loaded.dev  # type: ignore[union-attr]

    @functools.cached_property
    def model_config(self) -> Any:
        """The transformers config actually trained (imports transformers)."""
        return classifier_config(self.spec, self.task.num_labels, self.pad_id, self.task.kind)

    def trace_provider(self, batch_size: int, dtype: str = "float32") -> Callable[[int], StepTrace]:
        """padded length -> the twin's step trace for this model (cached on disk).

        A trace this workload used before is found through the `traces` index of `workloads/cache.py`
        without building the transformers config or importing torch; any other goes through the
        twin's TraceCache (which captures it on the meta device the first time). One provider per batch size and
        dtype, kept: every point of a sweep on this workload reads a length's trace once.
        """
        from dvfs_mlops.hw.twin.trace import TraceCache

        if (batch_size, dtype) in self._providers:
            return self._providers[(batch_size, dtype)]
        traces = TraceCache()
        memo: dict[int, StepTrace] = {}

        def get(n: int) -> StepTrace:
            if n not in memo:
                memo[n] = self._trace(traces, batch_size, n, dtype)
            return memo[n]

        self._providers[(batch_size, dtype)] = get
        return get

    def _trace_index_key(self, batch_size: int, seq_len: int, dtype: str) -> str | None:
        fp = self.spec.fingerprint if self.use_cache else None
        if fp is None:
            return None
        from dvfs_mlops.hw.twin.trace import TRACE_FORMAT

        what: dict[str, Any] = {"model": fp, "num_labels": self.task.num_labels, "kind": self.task.kind, "pad_id": self.pad_id,
                                "b": batch_size, "s": seq_len, "dt": dtype, "torch": cache.dist_version("torch"),
                                "transformers": cache.dist_version("transformers"), "fmt": TRACE_FORMAT,
                                "code": cache.code_digest("job.workloads.features", "hw.twin.trace")}
        if self.peft.is_lora:  # only LoRA adds to the key: a full fine-tune's does not depend on peft
            what.update(peft=self.peft.definition(), peft_version=cache.dist_version("peft"), peft_code=cache.code_digest("job.workloads.adapters"))
        return cache.digest(what)

    def _trace(self, traces: TraceCache, batch_size: int, seq_len: int, dtype: str) -> StepTrace:
        key = self._trace_index_key(batch_size, seq_len, dtype)
        if key is not None:
            hit = cache.read("traces", key)
            trace = _stored_trace(traces.directory, str(hit.get("trace_key"))) if hit else None
            if trace is not None:
                return trace
        trace = traces.get(self.model_config, batch_size, seq_len, dtype, self.task.num_labels, self.peft, kind=self.task.kind)
        if key is not None:
            cache.write("traces", key, {"trace_key": trace.key},
                        described={"workload": self.name, "batch_size": batch_size, "seq_len": seq_len, "dtype": dtype})
        return trace


def _stored_trace(directory: Path, trace_key: str) -> StepTrace | None:
    """The twin's stored trace with this key, or None (absent, corrupt, another format)."""
    from dvfs_mlops.hw.twin.trace import TRACE_FORMAT, StepTrace

    try:
        data = json.loads((Path(directory) / f"{trace_key}.json").read_text())
        if data.get("format") != TRACE_FORMAT or data.get("key") != trace_key:
            return None
        return StepTrace.from_json(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def lengths_key(task: TaskSpec, source: str, data_dir: str | None, seed: int, train_size: int, max_length: int,
                pretrained: str | None) -> str | None:
    """The cache key of a training split's token lengths, or None where it cannot be known without loading.

    It names the task, the data source and what determines its content (synthetic: seed, size and
    the generator's code; tsv: the digests of both files, so a cache hit also means they parsed; for a
    causal-LM task the JSONL files and the instruct module's code), the tokenizer (WordPiece settings,
    `tokenizers` version, its code, and the LM encoding for a causal-LM task) and the split.
    """
    if pretrained is not None or source == "hub" or (source == "tsv" and data_dir is None):
        return None  # (tsv without a folder: loading says what is missing)
    what: dict[str, Any] = {"task": dataclasses.asdict(task), "split": "train", "source": source, "numpy": cache.dist_version("numpy")}
    if task.causal_lm:
        from dvfs_mlops.job.workloads.instruct import find_files

        code = cache.code_digest("job.workloads.instruct", "job.workloads.tasks")
        if source == "synthetic":
            what.update(seed=seed, train_size=train_size, code=code)
        else:
            train, dev = find_files(Path(str(data_dir)), task.name)
            what.update(train=cache.file_digest(train), dev=cache.file_digest(dev), code=code)
    elif source == "synthetic":
        what.update(seed=seed, train_size=train_size, code=cache.code_digest("job.workloads.synthetic", "job.workloads.tasks"))
    else:
        from dvfs_mlops.job.workloads.glue_tsv import check_task_dir

        folder = check_task_dir(Path(str(data_dir)), task)
        what.update(train=cache.file_digest(folder / "train.tsv"), dev=cache.file_digest(folder / task.dev_file),
                    code=cache.code_digest("job.workloads.glue_tsv", "job.workloads.tasks"))
    what["tokenizer"] = {"kind": "wordpiece", "vocab_size": WORDPIECE_VOCAB, "max_length": max_length,
                         "tokenizers": cache.dist_version("tokenizers"), "code": cache.code_digest("job.workloads.tokenizer")}
    if task.causal_lm:
        what["tokenizer"]["encoding"] = "prompt+sep+response+end"
    return cache.digest(what)


def prepare_workload(model: str | None, task: str, *, model_config_path: str | None = None, pretrained: str | None = None,
                     data_source: str = "synthetic", data_dir: str | None = None, seed: int = 0,
                     train_size: int = 2048, dev_size: int = 256, use_cache: bool = True, peft: PeftSpec = FULL,
                     precision: str = "fp32") -> PreparedWorkload:
    """A workload with its features; `use_cache=False` computes everything the slow way (and stores nothing).

    `peft` and `precision` are part of the workload: its name carries them (`+lora-r8a16+bf16`), its features count
    the trainable parameters and record the precision, and the twin traces the step as it runs."""
    max_length = MAX_LENGTH
    spec = resolve_model(model, model_config_path, pretrained)
    check_scratch_vocab(spec)
    task_spec = get_task(task)
    check_task_model(spec, task_spec.name, task_spec.kind)  # an encoder on a causal-LM task: one line, before anything runs
    source = "tsv" if data_dir is not None else data_source
    if source not in SOURCES:
        raise unknown("data source", source, SOURCES)

    def load() -> _Loaded:
        data = load_task(task, source, data_dir, seed, train_size, dev_size)
        encoder = (pretrained_tokenizer(pretrained, max_length) if pretrained
                   else train_wordpiece(training_texts(data.train), vocab_size=WORDPIECE_VOCAB, max_length=max_length))
        if task_spec.causal_lm:
            return _Loaded(data, encoder, encoder.encode_lm(data.train), encoder.encode_lm(data.dev))
        label_dtype = np.float32 if task_spec.is_regression else np.int64
        return _Loaded(data, encoder, encoder.encode(data.train, label_dtype), encoder.encode(data.dev, label_dtype))

    key = lengths_key(task_spec, source, data_dir, seed, train_size, max_length, pretrained) if use_cache else None
    hit = cache.read("lengths", key) if key is not None else None
    loaded: _Loaded | None = None
    lengths: list[int] | None = None
    if hit is not None:
        try:
            lengths, pad_id = [int(n) for n in hit["lengths"]], int(hit["pad_id"])
        except (KeyError, TypeError, ValueError):
            lengths = None
    if lengths is None:
        loaded = load()
        lengths, pad_id = [len(x) for x in loaded.train.ids], int(loaded.encoder.pad_id)
        if key is not None:
            cache.write("lengths", key, {"lengths": lengths, "pad_id": pad_id},
                        described={"task": task, "source": source, "split": "train", "tokenizer": "wordpiece"})

    def check(fresh: _Loaded) -> None:  # a cached workload loaded later: its lengths must be the ones decided on
        got = [len(x) for x in fresh.train.ids]
        if got != lengths or int(fresh.encoder.pad_id) != pad_id:
            log.warning("the cached token lengths of %s/%s differ from the freshly encoded ones; the cache entry is replaced",
                        spec.name, task)
            if key is not None:
                cache.write("lengths", key, {"lengths": got, "pad_id": int(fresh.encoder.pad_id)})

    facts = model_facts(spec, task_spec.num_labels, pad_id, use_cache=use_cache, task_kind=task_spec.kind, peft=peft)
    features = features_from_facts(facts, mean_length(lengths), precision=precision)
    return PreparedWorkload(f"{spec.name}/{task}{variant_suffix(peft, precision)}", spec, task_spec, source, lengths, pad_id, features,
                            load, loaded, on_loaded=check if loaded is None else None, use_cache=use_cache, peft=peft)
