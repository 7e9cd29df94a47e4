"""Built-in synthetic GLUE-like tasks: offline, deterministic by seed, learnable.

Each task keeps its format (single sentence or pair, its label set, regression for stsb) and its
length profile (mean tokenised length, DESIGN §5, with a realistic spread). Sentences are made
of pseudo-words; the label is carried by cue words from a per-class group mixed into filler (in
the second sentence for pair tasks), with a minority of conflicting cues, so a short fine-tune of
a small model clearly beats chance without being trivial.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from dvfs_mlops.job.workloads.tasks import Example, TaskSpec

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_N_FILLER = 1500
_CUES_PER_CLASS = 24
_CUE_SHARE = 0.4  # share of the label-bearing sentence's words that are cues
_CONFLICT_SHARE = 0.15  # share of cues drawn from another class


@lru_cache(maxsize=1)
def _lexicon() -> tuple[np.ndarray, list[np.ndarray]]:
    """Filler words and cue-word groups (up to 5 groups), fixed for every task and seed, as arrays: `rng.choice`
    draws the same indices from an array as from the list it would otherwise convert on every call."""
    rng = np.random.default_rng(20240601)
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < _N_FILLER + 5 * _CUES_PER_CLASS:
        w = "".join(rng.choice(syllables, size=int(rng.integers(2, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    filler = np.array(words[:_N_FILLER])
    cues = [np.array(words[_N_FILLER + i * _CUES_PER_CLASS:_N_FILLER + (i + 1) * _CUES_PER_CLASS]) for i in range(5)]
    return filler, cues


def _rng(task: TaskSpec, split: str, seed: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{task.name}|{split}|{seed}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _length(rng: np.random.Generator, mean_words: float) -> int:
    """Word count with GLUE-like spread (gamma, shape 4: CV 0.5)."""
    return max(2, int(round(rng.gamma(4.0, mean_words / 4.0))))


def _sentence(rng: np.random.Generator, n: int, cue_groups: list[np.ndarray], weights: np.ndarray | None) -> str:
    filler, _ = _lexicon()
    words = rng.choice(filler, size=n).tolist()
    if weights is not None:
        k = max(1, int(round(n * _CUE_SHARE)))
        pos = rng.choice(n, size=min(k, n), replace=False)
        groups = rng.choice(len(cue_groups), size=len(pos), p=weights)
        for p_, g in zip(pos, groups):
            words[p_] = str(rng.choice(cue_groups[g]))
    return " ".join(words)


def _class_weights(n_classes: int, label: int) -> np.ndarray:
    w = np.full(n_classes, _CONFLICT_SHARE / max(1, n_classes - 1))
    w[label] = 1.0 - _CONFLICT_SHARE
    return w


def make_split(task: TaskSpec, split: str, size: int, seed: int) -> list[Example]:
    """`size` examples of `task`'s synthetic `split` ("train" | "dev")."""
    rng = _rng(task, split, seed)
    _, cues = _lexicon()
    specials = 3 if task.pair else 2  # [CLS] a [SEP] (b [SEP])
    mean_words = max(2.0, task.mean_tokens - specials)
    out: list[Example] = []
    for _ in range(size):
        n = _length(rng, mean_words)
        if task.is_regression:
            score = float(rng.uniform(0, 5))
            weights = np.array([score / 5.0, 1.0 - score / 5.0])  # "similar" vs "dissimilar" cues
            groups, label = cues[:2], round(score, 3)
        else:
            label_i = int(rng.integers(task.num_labels))
            weights = _class_weights(task.num_labels, label_i)
            groups, label = cues[: task.num_labels], float(label_i)
        if task.pair:
            na = max(1, int(round(n * 0.6)))
            nb = max(1, n - na)
            out.append(Example(_sentence(rng, na, groups, None), _sentence(rng, nb, groups, weights), label))
        else:
            out.append(Example(_sentence(rng, n, groups, weights), None, label))
    return out
