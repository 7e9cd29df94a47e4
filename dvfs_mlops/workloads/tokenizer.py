"""Tokenisation and batching.

Offline, a BERT-style WordPiece is trained on the task's training text (`tokenizers`, seconds);
with `--pretrained`, the model's own tokenizer is used. Batches are padded dynamically to the
longest sequence, rounded up to a multiple of 8 (what GPU kernels like, and it keeps the twin's
trace cache small).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dvfs_mlops.workloads.tasks import Example

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_TO_MULTIPLE = 8


@dataclasses.dataclass
class Encoded:
    """A tokenised split: unpadded id lists and labels."""

    ids: list[list[int]]
    labels: np.ndarray

    @property
    def mean_length(self) -> float:
        return float(np.mean([len(x) for x in self.ids])) if self.ids else 0.0

    def __len__(self) -> int:
        return len(self.ids)


class TextEncoder:
    """A common face for our WordPiece and a transformers tokenizer."""

    def __init__(self, backend: Any, pad_id: int, max_length: int, hf: bool):
        self.backend = backend
        self.pad_id = pad_id
        self.max_length = max_length
        self._hf = hf

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size() if not self._hf else len(self.backend)

    def encode(self, examples: Sequence[Example], labels_dtype: Any = np.int64) -> Encoded:
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples]
        pair = any(x is not None for x in b)
        if self._hf:
            enc = self.backend(a, b if pair else None, truncation=True, max_length=self.max_length)
            ids = [list(x) for x in enc["input_ids"]]
        else:
            batch = self.backend.encode_batch(list(zip(a, b)) if pair else a)
            ids = [e.ids[: self.max_length] for e in batch]
        return Encoded(ids, np.asarray([e.label for e in examples], dtype=labels_dtype))


def train_wordpiece(texts: Sequence[str], vocab_size: int = 8000, max_length: int = 128) -> TextEncoder:
    """A BERT-style uncased WordPiece trained on `texts` (deterministic for the same texts)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return TextEncoder(tok, tok.token_to_id("[PAD]"), max_length, hf=False)


def pretrained_tokenizer(name_or_path: str, max_length: int = 128) -> TextEncoder:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return TextEncoder(tok, int(tok.pad_token_id), max_length, hf=True)


def training_texts(examples: Sequence[Example]) -> list[str]:
    return [t for e in examples for t in (e.text_a, e.text_b) if t]


def padded_length(lengths: Sequence[int]) -> int:
    m = max(lengths)
    return -(-m // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE


def collate(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded input ids and attention mask, padded to a multiple of 8."""
    width = padded_length([len(x) for x in ids])
    arr = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, x in enumerate(ids):
        arr[i, : len(x)] = x
        mask[i, : len(x)] = 1
    return arr, mask
