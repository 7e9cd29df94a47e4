"""MkDocs hook (mkdocs.yml, `hooks:`): the pages written from the code each time the site is built.

- `reference/environment.md`: `dvfs_mlops.settings.VARIABLES`, the one list of every environment variable.
- `reference/logged.md`: every param and metric a run logs (`dvfs_mlops.mlops.fields`) and the tags
  (`logged_params_and_metrics`).

The CLI reference (mkdocs-click) and the Python API (mkdocstrings) are those plugins' own, placed by their pages.
A new generated page is a function returning its Markdown, an entry in `GENERATED` and a line in mkdocs.yml's nav.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parents[1]


def _cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def environment_variables() -> str:
    """The page of every environment variable dvfs-mlops reads or sets, with its default (`settings.VARIABLES`)."""
    from dvfs_mlops.settings import VARIABLES

    rows = "\n".join(f"| `{v.name}` | {_cell(v.default)} | {_cell(v.meaning)} |" for v in VARIABLES)
    return f"""# Environment variables

Every variable dvfs-mlops reads (or sets, where you have not), with its default. They are read when a command asks
for them, never at import, so a value set in the environment takes effect on the next command. The one module that
reads them is `dvfs_mlops/settings.py` (`settings.VARIABLES` is this table's source).

| variable | default | what it does |
|---|---|---|
{rows}
"""


def _architecture_section(title: str) -> str:
    """The body of the `## {title}` section of docs/ARCHITECTURE.md (without its heading)."""
    text = (DOCS / "ARCHITECTURE.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0].strip()


def logged_params_and_metrics() -> str:
    """The page of every param and metric a run logs (`mlops.fields.markdown_table`, the one declaration the writer,
    the dataset reader and the governor's signature derive from), then the experiments and tags (the architecture
    page's MLflow schema)."""
    from dvfs_mlops.mlops.fields import markdown_table

    return ("# Logged params and metrics\n\nEvery param and metric a run logs, from the declaration the code writes and "
            "reads them by (`dvfs_mlops/mlops/fields.py`). *runs*: which runs carry it (a sweep point, a fine-tune, ...); "
            "*feature*: the governor reads it; *knob*: a setting of the job (`--knob NAME=VALUE`).\n\n" + markdown_table()
            + "\n## Experiments and tags\n\nWhat each MLflow experiment holds, and the tags its runs carry (from the "
            "architecture page's [MLflow schema](../ARCHITECTURE.md#mlflow-schema)).\n\n" + _architecture_section("MLflow schema") + "\n")


GENERATED: dict[str, Callable[[], str]] = {
    "reference/environment.md": environment_variables,
    "reference/logged.md": logged_params_and_metrics,
}


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages to the site's files (MkDocs' `on_files` event)."""
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files
