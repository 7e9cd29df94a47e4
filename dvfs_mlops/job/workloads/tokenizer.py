"""Tokenisation and batching.

Offline, a BERT-style WordPiece is trained on the task's training text (`tokenizers`, seconds);
with `--pretrained`, the model's own tokenizer is used. Batches are padded dynamically to the
longest sequence, rounded up to a multiple of 8 (what GPU kernels like, and it keeps the twin's
trace cache small).

A causal-LM task (`instruct`) is encoded as prompt tokens + separator + response tokens + end
token (our WordPiece: [SEP] both separates and ends; a pretrained tokenizer: its sep token, else a
newline, and its eos token), cut to max_length with at least half of it left to the response; the
loss and the metric read only the response positions (`Encoded.response_start`, `lm_labels`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from dvfs_mlops.job.workloads.tasks import Example

if TYPE_CHECKING:
    import numpy.typing as npt
    import tokenizers
    from transformers import PreTrainedTokenizerBase

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_TO_MULTIPLE = 8
IGNORE_INDEX = -100  # a label position the loss and the metric skip (transformers' convention)


@dataclasses.dataclass
class Encoded:
    """A tokenised split: unpadded id lists and labels."""

    ids: list[list[int]]
    labels: np.ndarray
    # causal-LM tasks: the index of each sequence's first response token (the loss is on positions >= it)
    response_start: list[int] | None = None

    @property
    def mean_length(self) -> float:
        return float(np.mean([len(x) for x in self.ids])) if self.ids else 0.0

    def __len__(self) -> int:
        return len(self.ids)


class TextEncoder:
    """A common face for our WordPiece and a transformers tokenizer."""

    def __init__(self, backend: tokenizers.Tokenizer | PreTrainedTokenizerBase, pad_id: int, max_length: int, hf: bool):
        self.backend: Any = backend  # which of the two: `hf`
        self.pad_id = pad_id
        self.max_length = max_length
        self._hf = hf

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size() if not self._hf else len(self.backend)

    def encode(self, examples: Sequence[Example], labels_dtype: npt.DTypeLike = np.int64) -> Encoded:
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

    def encode_lm(self, examples: Sequence[Example]) -> Encoded:
        """Prompt (text_a) + separator + response (text_b) + end token, with where each response starts."""
        prompts = [e.text_a for e in examples]
        responses = [e.text_b or "" for e in examples]
        if self._hf:
            p_ids = self.backend(prompts, add_special_tokens=False)["input_ids"]
            r_ids = self.backend(responses, add_special_tokens=False)["input_ids"]
            sep, end = self._hf_separator(), [int(self.backend.eos_token_id)]
        else:
            p_ids = [e.ids for e in self.backend.encode_batch(prompts, add_special_tokens=False)]
            r_ids = [e.ids for e in self.backend.encode_batch(responses, add_special_tokens=False)]
            sep = end = [int(self.backend.token_to_id("[SEP]"))]
        ids: list[list[int]] = []
        starts: list[int] = []
        for p, r in zip(p_ids, r_ids):
            seq, start = lm_sequence(list(p), list(r), sep, end, self.max_length)
            ids.append(seq)
            starts.append(start)
        return Encoded(ids, np.zeros(len(ids), dtype=np.int64), starts)

    def _hf_separator(self) -> list[int]:
        """A pretrained tokenizer's separator: its sep token, else a newline, else its eos token."""
        if getattr(self.backend, "sep_token_id", None) is not None:
            return [int(self.backend.sep_token_id)]
        newline = list(self.backend("\n", add_special_tokens=False)["input_ids"])
        return newline or [int(self.backend.eos_token_id)]


def lm_sequence(prompt: list[int], response: list[int], sep: list[int], end: list[int], max_length: int) -> tuple[list[int], int]:
    """prompt + sep + response + end, cut to max_length (the prompt's head and the response's head are kept, and the
    response keeps at least half the room when the prompt is long); returns the ids and where the response starts."""
    room = max_length - len(sep)
    answer = response + end
    keep_r = min(len(answer), max(room - len(prompt), room // 2))
    keep_p = min(len(prompt), room - keep_r)
    seq = prompt[:keep_p] + sep + answer[:keep_r]
    return seq, keep_p + len(sep)


def lm_labels(ids: Sequence[Sequence[int]], starts: Sequence[int], width: int) -> np.ndarray:
    """Labels of a right-padded causal-LM batch: the token id on response positions, IGNORE_INDEX on the prompt,
    the separator and padding (the model shifts them: position t's logits predict label t + 1)."""
    out = np.full((len(ids), width), IGNORE_INDEX, dtype=np.int64)
    for i, (x, s) in enumerate(zip(ids, starts)):
        out[i, s:len(x)] = x[s:]
    return out


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
    return TextEncoder(tok, cast(int, tok.token_to_id("[PAD]")), max_length, hf=False)  # [PAD] is one of SPECIALS


def pretrained_tokenizer(name_or_path: str, max_length: int = 128) -> TextEncoder:
    from transformers import AutoTokenizer

    from dvfs_mlops.job.workloads.hub import pretrained_offline_unless_reachable

    with pretrained_offline_unless_reachable(name_or_path) as hub_options:
        tok = AutoTokenizer.from_pretrained(name_or_path, **hub_options)
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
