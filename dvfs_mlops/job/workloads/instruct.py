"""The causal-LM instruction task's data: (prompt, response) pairs, synthetic or from JSONL files.

Synthetic (offline, deterministic by seed, learnable): a prompt is an operation word and a list of
pseudo-words; the response is that operation applied to the list (copy, reverse, rotate by one,
or translate each word through a fixed dictionary), so a model that reads the prompt can predict
every response token. Word counts follow the task's length profile: the mean full sequence
(prompt, separator, response, end token) is the task's `mean_tokens`, with a narrower spread than
GLUE's (CV 0.25) so that few examples are cut at the default 128 tokens.

Files (`--data-dir DIR`): `DIR/<task>/train.jsonl` and `DIR/<task>/dev.jsonl`, or `DIR/train.jsonl`
and `DIR/dev.jsonl` when DIR is the task's own folder. One JSON object per line,
`{"prompt": str, "response": str}` (other keys are ignored; blank lines are skipped). A bad line
is one error naming the file and line.

Standard library and numpy only, and nothing from `tasks.py` (which imports this module lazily):
pairs are plain tuples, turned into `Example`s there.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from dvfs_mlops.errors import DvfsError

OPERATIONS = ("copy", "reverse", "rotate", "translate")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_N_WORDS = 1200
_SPREAD_SHAPE = 16.0  # gamma shape of the word count: CV 0.25
# A full sequence is the operation word, n prompt words, the separator, n response words and the end token.
_FIXED_TOKENS = 3


@lru_cache(maxsize=1)
def _lexicon() -> tuple[list[str], dict[str, str]]:
    """Pseudo-words and the fixed translation dictionary (a permutation of them), the same for every seed."""
    rng = np.random.default_rng(20250115)
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: list[str] = []
    seen: set[str] = set(OPERATIONS)
    while len(words) < _N_WORDS:
        w = "".join(rng.choice(syllables, size=int(rng.integers(2, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    perm = rng.permutation(len(words))
    return words, {w: words[int(j)] for w, j in zip(words, perm)}


def _rng(name: str, split: str, seed: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{name}|{split}|{seed}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def apply_operation(op: str, words: list[str]) -> list[str]:
    """The response words for `op` on the prompt's words (what a model has to learn)."""
    if op == "copy":
        return list(words)
    if op == "reverse":
        return words[::-1]
    if op == "rotate":
        return words[1:] + words[:1]
    if op == "translate":
        return [_lexicon()[1][w] for w in words]
    raise ValueError(f"unknown operation {op!r}")


def make_pairs(name: str, split: str, size: int, seed: int, mean_tokens: int) -> list[tuple[str, str]]:
    """`size` synthetic (prompt, response) pairs of `split` ("train" | "dev"), deterministic by seed."""
    rng = _rng(name, split, seed)
    words, _ = _lexicon()
    mean_words = max(1.0, (mean_tokens - _FIXED_TOKENS) / 2.0)
    out: list[tuple[str, str]] = []
    for _ in range(size):
        n = max(2, int(round(rng.gamma(_SPREAD_SHAPE, mean_words / _SPREAD_SHAPE))))
        op = OPERATIONS[int(rng.integers(len(OPERATIONS)))]
        chosen = [str(w) for w in rng.choice(words, size=n)]
        out.append((f"{op} " + " ".join(chosen), " ".join(apply_operation(op, chosen))))
    return out


def layout_hint(name: str) -> str:
    return f"{name}/train.jsonl and {name}/dev.jsonl, or train.jsonl and dev.jsonl in DIR itself; one {{\"prompt\": ..., \"response\": ...}} per line"


def find_files(data_dir: Path, name: str) -> tuple[Path, Path]:
    """The task's train and dev JSONL files under a data dir (checked before a sweep starts)."""
    for folder in (data_dir / name, data_dir):
        train, dev = folder / "train.jsonl", folder / "dev.jsonl"
        if train.is_file() or dev.is_file():
            for f in (train, dev):
                if not f.is_file():
                    raise DvfsError(f"{f} does not exist ({layout_hint(name)})")
            return train, dev
    raise DvfsError(f"{data_dir} has no {name}/train.jsonl or train.jsonl for task {name} ({layout_hint(name)})")


def read_jsonl(path: Path) -> list[tuple[str, str]]:
    """The (prompt, response) pairs of one JSONL file; a bad line is one DvfsError naming file and line."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DvfsError(f"{path} does not exist") from None
    except UnicodeDecodeError as e:
        raise DvfsError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    pairs: list[tuple[str, str]] = []
    for lineno, line in enumerate(raw.removeprefix("\ufeff").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise DvfsError(f"{path}:{lineno}: not JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(row, dict):
            raise DvfsError(f"{path}:{lineno}: expected a JSON object with \"prompt\" and \"response\", found {type(row).__name__}")
        for key in ("prompt", "response"):
            if key not in row:
                raise DvfsError(f"{path}:{lineno}: no \"{key}\" key (each line is {{\"prompt\": ..., \"response\": ...}})")
            if not isinstance(row[key], str):
                raise DvfsError(f"{path}:{lineno}: \"{key}\" is {type(row[key]).__name__}, not a string")
        if not row["response"].strip():
            raise DvfsError(f"{path}:{lineno}: \"response\" is empty (the loss is on the response: there would be nothing to learn)")
        pairs.append((row["prompt"], row["response"]))
    if not pairs:
        raise DvfsError(f"{path} is empty (no {{\"prompt\": ..., \"response\": ...}} lines)")
    return pairs


def read_dir(data_dir: Path, name: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """train.jsonl and dev.jsonl of the task under a data dir."""
    train, dev = find_files(data_dir, name)
    return read_jsonl(train), read_jsonl(dev)
