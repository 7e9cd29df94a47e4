"""The nine GLUE tasks: format, labels, and where the data comes from.

Sources: `synthetic` (default: offline, deterministic, learnable, with each task's length
profile), `tsv` (a folder in the original GLUE layout, e.g. `SST-2/train.tsv`), and `hub`
(`datasets.load_dataset("nyu-mll/glue", task)`, for users who are online).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError, unknown


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    glue_dir: str  # folder name in the GLUE TSV layout
    pair: bool
    labels: tuple[str, ...]  # label names in the hub's index order; () for regression
    split: str  # "train" (characterisation workloads) | "eval" (held-out workloads)
    mean_tokens: int  # mean tokenised length (DESIGN §5), the synthetic length profile
    dev_file: str = "dev.tsv"

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)

    @property
    def metric(self) -> str:
        return "eval_pearson" if self.is_regression else "eval_accuracy"


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
    if name not in TASKS:
        raise unknown("task", name, list(TASKS))
    return TASKS[name]


def load_task(name: str, source: str = "synthetic", data_dir: str | Path | None = None, seed: int = 0,
              train_size: int = 2048, dev_size: int = 256) -> TaskData:
    """Load a task's train and dev splits from the chosen source."""
    task = get_task(name)
    if data_dir is not None:
        source = "tsv"
    if source not in SOURCES:
        raise unknown("data source", source, SOURCES)
    if source == "synthetic":
        from dvfs_mlops.workloads.synthetic import make_split

        return TaskData(task, make_split(task, "train", train_size, seed), make_split(task, "dev", dev_size, seed), source)
    if source == "tsv":
        if data_dir is None:
            raise DvfsError("--data-source tsv needs --data-dir DIR (the GLUE layout: SST-2/train.tsv, ...)")
        from dvfs_mlops.workloads.glue_tsv import read_task_dir

        train, dev = read_task_dir(Path(data_dir), task)
        return TaskData(task, train, dev, source)
    return TaskData(task, *_load_hub(task), source)


def _load_hub(task: TaskSpec) -> tuple[list[Example], list[Example]]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise DvfsError("the hub source needs the 'datasets' package") from None
    try:
        ds = datasets.load_dataset("nyu-mll/glue", task.name)
    except Exception as e:  # noqa: BLE001 - datasets raises many types when offline
        raise DvfsError(f"cannot load nyu-mll/glue/{task.name} from the hub ({type(e).__name__}); "
                        "offline? use --data-source synthetic or --data-dir DIR") from None
    dev_split = "validation_matched" if task.name == "mnli" else "validation"
    return hub_rows_to_examples(task, ds["train"]), hub_rows_to_examples(task, ds[dev_split])


HUB_TEXT_FIELDS = {
    "sst2": ("sentence", None), "cola": ("sentence", None), "qnli": ("question", "sentence"),
    "mrpc": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "rte": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"), "wnli": ("sentence1", "sentence2"),
}


def hub_rows_to_examples(task: TaskSpec, rows: Any) -> list[Example]:
    """Rows of the hub's GLUE dataset (dicts with its field names) -> Examples."""
    a, b = HUB_TEXT_FIELDS[task.name]
    return [Example(str(r[a]), str(r[b]) if b else None, float(r["label"])) for r in rows if float(r["label"]) >= 0]
