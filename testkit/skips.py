"""A pytest plugin that ends the run with one line: what was skipped, by group, and the command that enables each group.

Some tests need what a bare machine lacks (a FUSE device and libfuse, a PostgreSQL server, Chromium and its driver,
real GLUE samples) and skip with a reason without it. pytest's own summary counts them; this line says which groups
they were and how to run them, e.g.

    skipped: FUSE sysfs (3 tests: apt-get install -y fuse3 libfuse3-3), PostgreSQL fleet (10 tests: apt-get install -y postgresql)

or `skipped: none`. Each skip's reason is matched against `RULES` (first match wins); a reason no rule knows makes a
group of its own, named by its first words, with no command. The apt-get lines are `.ci/run`'s (CI installs the same
packages). Registered from tests/conftest.py (`pytest_plugins`); under pytest-xdist only the controller prints.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Generator, Iterable
from typing import Any

import pytest

DEV_EXTRAS = "pip install -e '.[dev]'"
UNKNOWN_WORDS = 5


@dataclasses.dataclass(frozen=True)
class Rule:
    """Skips whose reason matches `pattern` (a regex, any case) belong to `group`; `command` enables them."""

    group: str
    pattern: str
    command: str


RULES: tuple[Rule, ...] = (
    Rule("FUSE sysfs", r"no /dev/fuse|cannot open /dev/fuse",
         "a machine with /dev/fuse (docker run --device /dev/fuse --cap-add SYS_ADMIN)"),
    Rule("FUSE sysfs", r"mfusepy is not installed", DEV_EXTRAS),
    Rule("FUSE sysfs", r"\bFUSE\b|fusermount|libfuse|mfusepy|^mount failed", "apt-get install -y fuse3 libfuse3-3"),
    Rule("PostgreSQL fleet", r"PostgreSQL driver|psycopg", DEV_EXTRAS),
    Rule("PostgreSQL fleet", r"postgres", "apt-get install -y postgresql"),
    Rule("MLflow-UI browser", r"selenium", DEV_EXTRAS),
    Rule("MLflow-UI browser", r"chromium|chromedriver", "apt-get install -y chromium chromium-driver"),
    Rule("real GLUE samples", r"GLUE samples|DVFS_GLUE_SAMPLES", "export DVFS_GLUE_SAMPLES=DIR"),
)
GROUPS = tuple(dict.fromkeys(rule.group for rule in RULES))


def classify(reason: str) -> tuple[str, str | None]:
    """(group, command that enables it) of a skip reason; an unknown reason: (its first words, None)."""
    for rule in RULES:
        if re.search(rule.pattern, reason, re.IGNORECASE):
            return rule.group, rule.command
    words = reason.split()[:UNKNOWN_WORDS]
    return " ".join(words).rstrip(".,;:") or "no reason given", None


def summary_line(reasons: Iterable[str]) -> str:
    """The closing line for these skip reasons (one per skipped test): groups in `RULES` order, then unknown ones."""
    counts: dict[str, int] = {}
    commands: dict[str, list[str]] = {}
    for reason in reasons:
        group, command = classify(reason)
        counts[group] = counts.get(group, 0) + 1
        known = commands.setdefault(group, [])
        if command is not None and command not in known:
            known.append(command)
    if not counts:
        return "skipped: none"
    order = sorted(counts, key=lambda g: GROUPS.index(g) if g in GROUPS else len(GROUPS))  # stable: unknown ones first-seen
    return "skipped: " + ", ".join(_describe(g, counts[g], commands[g]) for g in order)


def _describe(group: str, n: int, commands: list[str]) -> str:
    tests = f"{n} test{'' if n == 1 else 's'}"
    return f"{group} ({tests}: {'; '.join(commands)})" if commands else f"{group} ({tests})"


def skip_reason(report: Any) -> str:
    """The reason a skipped test report gives, without pytest's 'Skipped: ' prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return str(text).removeprefix("Skipped: ")


def skipped_reasons(stats: dict[str, list[Any]]) -> list[str]:
    """Reasons of the skips pytest's summary counts (the terminal reporter's `stats`; xfails are not skips there)."""
    return [skip_reason(r) for r in stats.get("skipped", []) if getattr(r, "count_towards_summary", True)]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None]:
    """Around the terminal reporter's own sessionfinish (outermost: tryfirst), so the line follows its
    'N passed, M skipped' line. Not in an xdist worker: the controller sees every worker's reports."""
    result = yield
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(session.config, "workerinput"):
        reporter.write_line(summary_line(skipped_reasons(reporter.stats)))
    return result
