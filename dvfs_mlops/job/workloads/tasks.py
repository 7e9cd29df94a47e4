"""The tasks: the nine GLUE tasks and the causal-LM `instruct` task; format, labels, and where the data comes from.

Sources: `synthetic` (default: offline, deterministic, learnable, with each task's length
profile), `tsv` (the files of `--data-dir`: a folder in the original GLUE layout, e.g.
`SST-2/train.tsv`; for `instruct`, `instruct/train.jsonl` and `dev.jsonl`, see
`workloads/instruct.py`), and `hub` (`datasets.load_dataset("nyu-mll/glue", task)`, for users
who are online; with the hub unreachable, the copy in the datasets cache or one line at once; `instruct` has none).

`TASKS` stays the nine GLUE tasks (the paper preset, the twin's calibration and their tests iterate
it); `ALL_TASKS` adds the causal-LM tasks, and `get_task` knows all of them.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError, unknown

# Task kinds: which head is trained (sequence classifier, or the LM head with loss on the response) and the metric.
CLASSIFICATION, REGRESSION, CAUSAL_LM = "classification", "regression", "causal_lm"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    glue_dir: str  # folder name in the GLUE TSV layout
    pair: bool
    labels: tuple[str, ...]  # label names in the hub's index order; () for regression
    split: str  # "train" (characterisation workloads) | "eval" (held-out workloads)
    mean_tokens: int  # mean tokenised length (DESIGN §5), the synthetic length profile
    dev_file: str = "dev.tsv"
    causal_lm: bool = False  # an instruction task: prompt -> response, next-token loss on the response

    @property
    def kind(self) -> str:
        """classification | regression | causal_lm: the head trained and the metric reported."""
        return CAUSAL_LM if self.causal_lm else REGRESSION if not self.labels else CLASSIFICATION

    @property
    def is_regression(self) -> bool:
        return self.kind == REGRESSION

    @property
    def is_causal_lm(self) -> bool:
        return self.causal_lm

    @property
    def num_labels(self) -> int:
        """The classifier head's size (0 for a causal-LM task, which has no classifier head)."""
        return 0 if self.causal_lm else 1 if self.is_regression else len(self.labels)

    @property
    def metric(self) -> str:
        return eval_metric(self.causal_lm, self.is_regression)


def eval_metric(causal_lm: bool, is_regression: bool) -> str:
    """The metric a task of this kind is evaluated with (the run's metric name)."""
    if causal_lm:
        return "eval_token_accuracy"  # next-token accuracy on the response tokens
    return "eval_pearson" if is_regression else "eval_accuracy"


_BIN = ("0", "1")
_ENT2 = ("entailment", "not_entailment")
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("sst2", "SST-2", False, _BIN, "train", 13),
        TaskSpec("qnli", "QNLI", True, _ENT2, "train", 51),
        TaskSpec("mrpc", "MRPC", True, _BIN, "train", 53),
        TaskSpec("qqp", "QQP", True, _BIN, "eval", 30),
        TaskSpec("rte", "RTE", True, _ENT2, "eval", 73),
        TaskSpec("cola", "CoLA", False, _BIN, "eval", 11),
        TaskSpec("stsb", "STS-B", True, (), "eval", 31),
        TaskSpec("mnli", "MNLI", True, ("entailment", "neutral", "contradiction"), "eval", 39, "dev_matched.tsv"),
        TaskSpec("wnli", "WNLI", True, _BIN, "eval", 38),
    )
}
# Causal-LM tasks, beside GLUE. `instruct` is a held-out ("eval") workload, so the governor's
# characterisation set stays GLUE's; ~96 tokens (prompt + separator + response + end) is a short
# instruction-tuning example (Alpaca-style pairs run ~60-200 tokens). Data layout: workloads/instruct.py.
LM_TASKS: dict[str, TaskSpec] = {
    t.name: t for t in (TaskSpec("instruct", "instruct", True, (), "eval", 96, "dev.jsonl", causal_lm=True),)
}
ALL_TASKS: dict[str, TaskSpec] = {**TASKS, **LM_TASKS}
CHARACTERISATION_TASKS = tuple(n for n, t in TASKS.items() if t.split == "train")
SOURCES = ("synthetic", "tsv", "hub")


@dataclasses.dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str | None
    label: float  # class index, or the score for regression


@dataclasses.dataclass
class TaskData:
    task: TaskSpec
    train: list[Example]
    dev: list[Example]
    source: str


def get_task(name: str) -> TaskSpec:
    if name not in ALL_TASKS:
        raise unknown("task", name, list(ALL_TASKS))
    return ALL_TASKS[name]


def load_task(name: str, source: str = "synthetic", data_dir: str | Path | None = None, seed: int = 0,
              train_size: int = 2048, dev_size: int = 256) -> TaskData:
    """Load a task's train and dev splits from the chosen source."""
    task = get_task(name)
    if data_dir is not None:
        source = "tsv"
    if source not in SOURCES:
        raise unknown("data source", source, SOURCES)
    if task.causal_lm:
        return _load_lm(task, source, data_dir, seed, train_size, dev_size)
    if source == "synthetic":
        from dvfs_mlops.job.workloads.synthetic import make_split

        return TaskData(task, make_split(task, "train", train_size, seed), make_split(task, "dev", dev_size, seed), source)
    if source == "tsv":
        if data_dir is None:
            raise DvfsError("--data-source tsv needs --data-dir DIR (the GLUE layout: SST-2/train.tsv, ...)")
        from dvfs_mlops.job.workloads.glue_tsv import read_task_dir

        train, dev = read_task_dir(Path(data_dir), task)
        return TaskData(task, train, dev, source)
    return TaskData(task, *_load_hub(task), source)


def _load_lm(task: TaskSpec, source: str, data_dir: str | Path | None, seed: int, train_size: int, dev_size: int) -> TaskData:
    """A causal-LM task's (prompt, response) pairs as Examples (text_a = prompt, text_b = response, label 0)."""
    from dvfs_mlops.job.workloads import instruct

    if source == "hub":
        raise DvfsError(f"task {task.name} has no hub dataset; use --data-source synthetic or --data-dir DIR "
                        f"({instruct.layout_hint(task.name)})")
    if source == "synthetic":
        train = instruct.make_pairs(task.name, "train", train_size, seed, task.mean_tokens)
        dev = instruct.make_pairs(task.name, "dev", dev_size, seed, task.mean_tokens)
        return TaskData(task, _pairs_to_examples(train), _pairs_to_examples(dev), source)
    if data_dir is None:
        raise DvfsError(f"--data-source tsv needs --data-dir DIR ({instruct.layout_hint(task.name)})")
    train, dev = instruct.read_dir(Path(data_dir), task.name)
    return TaskData(task, _pairs_to_examples(train), _pairs_to_examples(dev), "jsonl")


def _pairs_to_examples(pairs: list[tuple[str, str]]) -> list[Example]:
    return [Example(p, r, 0.0) for p, r in pairs]


def _load_hub(task: TaskSpec) -> tuple[list[Example], list[Example]]:
    """The task's train and dev splits of `nyu-mll/glue`; with the hub unreachable, the datasets cache's copy, asked
    without a network request (`hub.datasets_offline_unless_reachable`).

    Raises:
        DvfsError: the package is missing, or the dataset cannot be loaded: one line naming the way out.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise DvfsError("the hub source needs the 'datasets' package") from None
    from dvfs_mlops.job.workloads.hub import datasets_offline_unless_reachable, hub_endpoint

    name = f"nyu-mll/glue/{task.name}"
    with datasets_offline_unless_reachable() as online:
        try:
            ds = datasets.load_dataset("nyu-mll/glue", task.name)
        except Exception as e:  # noqa: BLE001 - datasets raises many types when offline
            if not online:
                raise DvfsError(f"the Hugging Face Hub ({hub_endpoint()}) is unreachable and {name} is not in the datasets "
                                f"cache; use --data-dir DIR (GLUE TSV files) or --data-source synthetic") from None
            raise DvfsError(f"cannot load {name} from the hub ({type(e).__name__}); "
                            "use --data-dir DIR (GLUE TSV files) or --data-source synthetic") from None
    if not online:
        log.info("the Hugging Face Hub is unreachable: %s comes from the datasets cache", name)
    dev_split = "validation_matched" if task.name == "mnli" else "validation"
    return hub_rows_to_examples(task, ds["train"]), hub_rows_to_examples(task, ds[dev_split])


HUB_TEXT_FIELDS = {
    "sst2": ("sentence", None), "cola": ("sentence", None), "qnli": ("question", "sentence"),
    "mrpc": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "rte": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"), "wnli": ("sentence1", "sentence2"),
}


def hub_rows_to_examples(task: TaskSpec, rows: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Rows of the hub's GLUE dataset (dicts with its field names) -> Examples."""
    a, b = HUB_TEXT_FIELDS[task.name]
    return [Example(str(r[a]), str(r[b]) if b else None, float(r["label"])) for r in rows if float(r["label"]) >= 0]
