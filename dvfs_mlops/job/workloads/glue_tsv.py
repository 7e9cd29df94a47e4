"""Reader for the original GLUE TSV layout, tolerant of the quirks real copies have.

Files are read as plain tab-separated text, never with CSV quoting (MRPC and others contain
unbalanced double quotes). Headers are matched by name, with the aliases seen in the wild (SST-2
copies headed `text\\tlabel`); headerless files (CoLA always, STS-B copies) are read by position.
U+FEFF (BOM / zero-width no-break space) is stripped from every field. Rows are as wide as line 1
(trailing empty fields aside): a wider row has a stray tab, which would shift the columns, so it is
refused like a row too short for the columns read. A malformed row names the file and line.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads.tasks import Example, TaskSpec


@dataclasses.dataclass(frozen=True)
class Layout:
    text_a: tuple[str, ...]  # header names (aliases) of the first text column
    text_b: tuple[str, ...] | None
    label: tuple[str, ...]
    positional: tuple[int, int | None, int] | None  # (a, b, label) indices for headerless files; -1 = last


LAYOUTS: dict[str, Layout] = {
    "sst2": Layout(("sentence", "text"), None, ("label",), None),
    "cola": Layout((), None, (), (3, None, 1)),  # source, label, original label, sentence; no header
    "qnli": Layout(("question",), ("sentence",), ("label",), None),
    "mrpc": Layout(("#1 String",), ("#2 String",), ("Quality",), (3, 4, 0)),
    "qqp": Layout(("question1",), ("question2",), ("is_duplicate",), (3, 4, 5)),
    "rte": Layout(("sentence1",), ("sentence2",), ("label",), (1, 2, 3)),
    "wnli": Layout(("sentence1",), ("sentence2",), ("label",), (1, 2, 3)),
    "stsb": Layout(("sentence1",), ("sentence2",), ("score",), (7, 8, -1)),
    "mnli": Layout(("sentence1",), ("sentence2",), ("gold_label",), (8, 9, -1)),
}


def _clean(field: str) -> str:
    return field.replace("\ufeff", "").strip()


def _fields(line: str) -> list[str]:
    """The tab-separated fields of one line, without a trailing CR or trailing empty fields."""
    fields = line.rstrip("\r").split("\t")
    while len(fields) > 1 and not _clean(fields[-1]):
        fields.pop()
    return fields


def _index(header: list[str], names: tuple[str, ...]) -> int | None:
    for n in names:
        if n in header:
            return header.index(n)
    return None


def read_glue_tsv(path: Path, task: TaskSpec) -> list[Example]:
    """Examples of one GLUE TSV file."""
    layout = LAYOUTS[task.name]
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DvfsError(f"{path} does not exist; the GLUE layout needs {task.glue_dir}/train.tsv and {task.glue_dir}/{task.dev_file}") from None
    except UnicodeDecodeError as e:
        raise DvfsError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DvfsError(f"{path} is empty")
    first = [_clean(f) for f in _fields(lines[0])]
    width = len(first)
    ia = _index(first, layout.text_a) if layout.text_a else None
    il = _index(first, layout.label) if layout.label else None
    if ia is not None and il is not None:
        ib = _index(first, layout.text_b) if layout.text_b else None
        if layout.text_b and ib is None:
            raise DvfsError(f"{path}:1: header has no {' or '.join(layout.text_b)} column: {first}")
        start = 1
    elif layout.positional is not None:
        ia, ib, il = layout.positional
        start = 0
    else:
        raise DvfsError(f"{path}:1: header {first} has no {'/'.join(layout.text_a)} and {'/'.join(layout.label)} columns")
    # a label read as "the last column" (-1) is a column of its own, after the texts
    needed = max(i for i in (ia, ib, il) if i is not None and i >= 0) + 1 + (1 if il < 0 else 0)
    examples: list[Example] = []
    for lineno, line in enumerate(lines[start:], start=start + 1):
        if not line.strip():
            continue
        fields = _fields(line)
        if len(fields) < needed:
            raise DvfsError(f"{path}:{lineno}: expected at least {needed} tab-separated fields, found {len(fields)}")
        if len(fields) > width:
            raise DvfsError(f"{path}:{lineno}: expected {width} tab-separated fields as on line 1, found {len(fields)} "
                            "(a tab inside a field?)")
        label_text = _clean(fields[il])
        examples.append(Example(_clean(fields[ia]), _clean(fields[ib]) if ib is not None else None,
                                _parse_label(label_text, task, path, lineno)))
    return examples


def _parse_label(text: str, task: TaskSpec, path: Path, lineno: int) -> float:
    if task.is_regression:
        try:
            return float(text)
        except ValueError:
            raise DvfsError(f"{path}:{lineno}: score {text!r} is not a number") from None
    if text in task.labels:
        return float(task.labels.index(text))
    raise DvfsError(f"{path}:{lineno}: label {text!r} is not one of {', '.join(task.labels)}")


def check_task_dir(data_dir: Path, task: TaskSpec) -> Path:
    """The task's folder under a GLUE data dir, with both files present (checked before a sweep starts)."""
    folder = data_dir / task.glue_dir
    layout = f"GLUE layout: {task.glue_dir}/train.tsv, {task.glue_dir}/{task.dev_file}"
    if not folder.is_dir():
        raise DvfsError(f"{data_dir} has no {task.glue_dir}/ folder for task {task.name} ({layout})")
    for name in ("train.tsv", task.dev_file):
        if not (folder / name).is_file():
            raise DvfsError(f"{folder / name} does not exist ({layout})")
    return folder


def read_task_dir(data_dir: Path, task: TaskSpec) -> tuple[list[Example], list[Example]]:
    """train.tsv and the dev file of one task under a GLUE data dir."""
    folder = check_task_dir(data_dir, task)
    return read_glue_tsv(folder / "train.tsv", task), read_glue_tsv(folder / task.dev_file, task)
