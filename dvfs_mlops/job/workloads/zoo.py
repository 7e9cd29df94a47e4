"""Model presets of the study (random init from config) and arbitrary transformers configs.

Presets carry the real models' architecture, vocabulary included, so parameter counts match the
published checkpoints (bert-base 110M, pythia-1b 1.01B with its LM head; our classifiers drop the
head). `--pretrained NAME_OR_PATH` loads real weights instead, for users who have them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError, unknown

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The WordPiece vocabulary a model trained from scratch reads (workloads/prepare.py trains it on the task's text).
WORDPIECE_VOCAB = 8000

ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta", "mobilebert"}


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """One of the study's model sizes."""

    name: str
    family: str  # bert | pythia
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    hub_id: str  # where real weights live, for --pretrained

    def config_source(self) -> dict[str, Any]:
        """`model_type` and the keyword arguments its transformers config is built from (plain data, no import)."""
        if self.family == "bert":
            return {"model_type": "bert", "vocab_size": 30522, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                    "num_attention_heads": self.num_heads, "intermediate_size": self.intermediate_size, "max_position_embeddings": 512}
        return {"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "intermediate_size": self.intermediate_size, "max_position_embeddings": 2048,
                "rotary_pct": 0.25, "use_parallel_residual": True, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0}

    def config(self) -> Any:
        kwargs = self.config_source()
        model_type = kwargs.pop("model_type")
        if model_type == "bert":
            from transformers import BertConfig

            return BertConfig(**kwargs)
        from transformers import GPTNeoXConfig

        return GPTNeoXConfig(**kwargs)


def _bert(name: str, layers: int, hidden: int, hub_id: str) -> ModelPreset:
    return ModelPreset(name, "bert", layers, hidden, max(2, hidden // 64), 4 * hidden, hub_id)


def _pythia(name: str, layers: int, hidden: int, heads: int) -> ModelPreset:
    return ModelPreset(name, "pythia", layers, hidden, heads, 4 * hidden, f"EleutherAI/{name}")


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        _bert("bert-tiny", 2, 128, "google/bert_uncased_L-2_H-128_A-2"),
        _bert("bert-mini", 4, 256, "google/bert_uncased_L-4_H-256_A-4"),
        _bert("bert-small", 4, 512, "google/bert_uncased_L-4_H-512_A-8"),
        _bert("bert-medium", 8, 512, "google/bert_uncased_L-8_H-512_A-8"),
        _bert("bert-base", 12, 768, "google-bert/bert-base-uncased"),
        _bert("bert-large", 24, 1024, "google-bert/bert-large-uncased"),
        _pythia("pythia-14m", 6, 128, 4),
        _pythia("pythia-31m", 6, 256, 8),
        _pythia("pythia-70m", 6, 512, 8),
        _pythia("pythia-160m", 12, 768, 12),
        _pythia("pythia-410m", 24, 1024, 16),
        _pythia("pythia-1b", 16, 2048, 8),
    )
}


class ModelSpec:
    """A resolved model: its name, its transformers config (built on first use), and where weights come from.

    `source` is the plain data the config is built from (a preset's arguments, a config file's JSON):
    with it, `fingerprint` names the config without importing transformers, which is what lets a
    decision read the model's features from the cache. It is None where only transformers can say
    what the config is (a pretrained name, a folder without config.json).
    """

    def __init__(self, name: str, config: PretrainedConfig | None = None, pretrained: str | None = None, *,
                 source: dict[str, Any] | None = None, build: Callable[[], PretrainedConfig] | None = None):
        if config is None and build is None:
            raise ValueError("ModelSpec needs a config or a way to build one")
        self.name = name
        self.pretrained = pretrained
        self.source = source
        self._config = config
        self._build = build

    def __repr__(self) -> str:
        return f"ModelSpec(name={self.name!r}, pretrained={self.pretrained!r}, built={self._config is not None})"

    @property
    def config(self) -> Any:
        if self._config is None:
            assert self._build is not None
            self._config = self._build()
        return self._config

    @property
    def fingerprint(self) -> str | None:
        """A key of the config: its source, the transformers version that builds it and this module's code."""
        if self.source is None:
            return None
        from dvfs_mlops.job.workloads.cache import code_digest, digest, dist_version

        return digest({"source": self.source, "transformers": dist_version("transformers"), "code": code_digest("job.workloads.zoo")})

    @property
    def model_type(self) -> str:
        """encoder | decoder, the governor's categorical feature."""
        return "encoder" if getattr(self.config, "model_type", "") in ENCODER_TYPES else "decoder"

    @property
    def num_layers(self) -> int:
        return int(_first_attr(self.config, ("num_hidden_layers", "n_layer", "num_layers")))

    @property
    def hidden_size(self) -> int:
        return int(_first_attr(self.config, ("hidden_size", "d_model", "n_embd")))


def _first_attr(config: PretrainedConfig, names: tuple[str, ...]) -> Any:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    raise DvfsError(f"model config {type(config).__name__} has none of {', '.join(names)}; pass a transformers config with a layer count and hidden size")


def _config_error(path: Path, e: Exception) -> DvfsError:
    return DvfsError(f"cannot read model config {path}: {e}")


def _read_config_json(path: Path) -> dict[str, Any]:
    """A transformers config.json's data: JSON holding a `model_type` (one line naming the file otherwise)."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise _config_error(path, e) from None
    if not isinstance(data, dict) or data.get("model_type") is None:
        raise DvfsError(f"{path} has no 'model_type'; it is not a transformers config")
    return data


def _from_file(path: Path, data: dict[str, Any]) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import AutoConfig

        kwargs = dict(data)
        model_type = kwargs.pop("model_type")
        try:
            return AutoConfig.for_model(model_type, **kwargs)
        except (ValueError, KeyError, OSError) as e:
            raise _config_error(path, e) from None

    return build


def _from_folder(path: Path) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(str(path))
        except (ValueError, KeyError, OSError) as e:
            raise _config_error(path, e) from None

    return build


def check_scratch_vocab(spec: ModelSpec) -> None:
    """A config trained from scratch reads our WordPiece's token ids: its embedding must hold all of them.
    Read from the config's JSON (no transformers import); presets and pretrained models (their own tokenizer) pass."""
    if spec.pretrained is not None or spec.source is None:
        return
    data = spec.source.get("file") or spec.source.get("folder") or {}
    vocab = data.get("vocab_size")
    if isinstance(vocab, int) and vocab < WORDPIECE_VOCAB:
        raise DvfsError(f"model {spec.name} has vocab_size {vocab}; trained from scratch it reads a WordPiece vocabulary of "
                        f"{WORDPIECE_VOCAB} tokens: set vocab_size >= {WORDPIECE_VOCAB} in its config, or give a pretrained model "
                        "with its own tokenizer")


def _source_model_type(spec: ModelSpec) -> str | None:
    """The config's `model_type` from its plain-data source (no transformers import), None where only transformers knows."""
    if spec.source is None:
        return None
    data = spec.source.get("preset") or spec.source.get("file") or spec.source.get("folder") or {}
    value = data.get("model_type")
    return str(value) if value is not None else None


def check_task_model(spec: ModelSpec, task_name: str, task_kind: str) -> None:
    """A causal-LM task trains the model's LM head: an encoder (BERT-style) has none, so it is refused in one line,
    before anything runs. Read from the config's plain data where it has some (a warm decision imports nothing)."""
    if task_kind != "causal_lm":
        return
    model_type = _source_model_type(spec) or str(getattr(spec.config, "model_type", ""))
    if model_type in ENCODER_TYPES:
        raise DvfsError(f"task {task_name} is a causal-LM (instruction) task and needs a decoder model, such as a pythia "
                        f"preset or a Llama/Qwen/OPT config; {spec.name} is an encoder ({model_type})")


def resolve_model(name: str | None = None, config_path: str | Path | None = None, pretrained: str | None = None) -> ModelSpec:
    """A preset name, a transformers config file/folder, or a pretrained name/path.

    A preset's or a config file's transformers config is built on first use of `spec.config`; a
    file is read (and its `model_type` checked) here.
    """
    if config_path is not None:
        path = Path(config_path)
        if not path.exists():
            raise DvfsError(f"model config {path} does not exist; pass a config.json or a folder holding one")
        if path.is_file():
            data = _read_config_json(path)
            label = name or (path.parent.name if path.stem == "config" else path.stem)
            return ModelSpec(label or "custom", source={"file": data}, build=_from_file(path, data))
        source = None
        folder_json = path / "config.json"
        if folder_json.is_file():
            try:
                source = {"folder": json.loads(folder_json.read_text())}
            except (ValueError, OSError):
                source = None  # transformers says what is wrong with it when the config is built
        return ModelSpec(name or path.name or "custom", source=source, build=_from_folder(path))
    if pretrained is not None:
        from transformers import AutoConfig

        from dvfs_mlops.job.workloads.hub import pretrained_offline_unless_reachable

        hub_log = logging.getLogger("huggingface_hub")
        level = hub_log.level
        hub_log.setLevel(logging.ERROR)  # it warns about each failed request before the error we turn into one line
        try:
            with pretrained_offline_unless_reachable(pretrained) as hub_options:
                config = AutoConfig.from_pretrained(pretrained, **hub_options)
        except OSError as e:
            raise DvfsError(f"cannot load pretrained model {pretrained!r} (offline? pass a local folder): {e}".splitlines()[0]) from None
        finally:
            hub_log.setLevel(level)
        return ModelSpec(name or Path(pretrained).name, config, pretrained=pretrained)
    if name is None:
        raise DvfsError("name a model preset or pass --model-config PATH")
    if name not in PRESETS:
        raise unknown("model", name, list(PRESETS))
    preset = PRESETS[name]
    return ModelSpec(name, source={"preset": preset.config_source()}, build=preset.config)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One entry of a model list (`sweep --models`): the workload's model name and where its config comes from.

    The name is what runs, resume keys and the governor see, so it is readable and the same on every machine:
    a preset's name; for a config file or folder, its name plus a digest of the config's content (a path is
    not an identity: two boards hold the same config at different paths, and an edited config is another
    model); for a hub model, its id with '/' as '--' (a workload is "MODEL/TASK")."""

    name: str
    config_path: str | None = None
    pretrained: str | None = None

    def prepare_kwargs(self) -> dict[str, Any]:
        """prepare_workload's model arguments."""
        return {"model": self.name, "model_config_path": self.config_path, "pretrained": self.pretrained}


def _config_digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:6]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def model_entry(text: str) -> ModelEntry:
    """A preset name, a transformers config.json (or a folder holding one; with weights beside it, a local
    pretrained model) or a hub name ORG/NAME -> a `ModelEntry`. Reads a config file, never the network."""
    if text in PRESETS:
        return ModelEntry(text)
    path = Path(text).expanduser()
    if path.exists():
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise DvfsError(f"model folder {path} has no config.json; pass a transformers config.json or a folder holding one")
        data = _read_config_json(config_file)
        label = path.name if path.is_dir() else (path.parent.name if path.stem == "config" else path.stem)
        name = f"{_slug(label)}-{_config_digest(data)}"
        if path.is_dir() and any((path / w).is_file() for w in WEIGHT_FILES):
            return ModelEntry(name, pretrained=str(path.resolve()))
        return ModelEntry(name, config_path=str(path.resolve()))
    if text.endswith(".json") or text.startswith((".", "/", "~")):
        raise DvfsError(f"model config {text} does not exist; pass a config.json or a folder holding one")
    if _HUB_NAME.fullmatch(text):
        return ModelEntry(text.replace("/", "--"), pretrained=text)
    raise DvfsError(f"unknown model {text!r}; valid models: a preset ({', '.join(PRESETS)}), a transformers config.json "
                    "or folder, or a hub name ORG/NAME")
