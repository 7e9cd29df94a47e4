"""The documentation site builds as `make docs` builds it (`mkdocs build --strict`): no warning, no broken link, no
missing reference; the generated pages hold what the code declares; the benchmarks page says for every table how it
was made. A few seconds."""
from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"
OURS_ONLY = {"ARCHITECTURE.md", "API.md"}  # written by hand elsewhere; the site links them as they are


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                        "--site-dir", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    problems = [line for line in (r.stdout + r.stderr).splitlines() if re.match(r"\S*(WARNING|ERROR)", line)]
    assert r.returncode == 0 and not problems, "\n".join(problems) or r.stderr[-3000:]
    return out


def _text(page: Path) -> str:
    """The visible text of a built page, tags dropped, on one line."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())


def test_every_page_of_the_nav_is_built(site):
    import yaml

    def pages(nav):
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    for page in pages(config["nav"]):
        built = site / (page.removesuffix(".md").removesuffix("index") + "/index.html").lstrip("/")
        assert built.is_file(), page


def test_the_environment_page_lists_every_variable_with_its_default(site):
    from dvfs_mlops.settings import VARIABLES

    text = (site / "reference" / "environment" / "index.html").read_text()
    for v in VARIABLES:
        row = re.search(rf"<td><code>{v.name}</code></td>\s*<td>(.*?)</td>", text, re.DOTALL)
        assert row and v.default in html.unescape(row.group(1)), v.name


def test_the_cli_page_documents_every_command(site):
    import click

    from dvfs_mlops.app.cli import main

    def paths(group: click.Group, prefix: str):
        for name, cmd in group.commands.items():
            yield f"{prefix} {name}"
            if isinstance(cmd, click.Group):
                yield from paths(cmd, f"{prefix} {name}")

    text = _text(site / "reference" / "cli" / "index.html")
    missing = [p for p in paths(main, "dvfs-mlops") if f"{p} [OPTIONS]" not in text and f"{p} [OPTIONS] " not in text]
    assert not missing, missing


def test_the_api_page_renders_the_entry_points_from_their_docstrings(site):
    from dvfs_mlops.hw import open_device
    from dvfs_mlops.mlops.governor import load_governor

    text = _text(site / "reference" / "api" / "index.html")
    for fn in (open_device, load_governor):
        first_line = " ".join(fn.__doc__.strip().splitlines()[0].replace("`", "").split())
        assert first_line in text, fn.__name__
    assert "DvfsCallback" in text and "FreqSession" in text and "fit_curve" in text


def test_the_logged_page_holds_the_mlflow_schema(site):
    text = _text(site / "reference" / "logged" / "index.html")
    assert all(name in text for name in ("dvfs-sweep", "energy_j", "dvfs.sweep_id", "gpu_util_probe_pct"))


def _pages() -> list[Path]:
    return [p for p in DOCS.rglob("*.md") if p.name not in OURS_ONLY]


def test_no_page_narrates_tests_or_history():
    """A page says what is, not how it came to be or which test checks it (a command that runs a test is a command)."""
    history = re.compile(r"\bused to be\b|\bsince issue\b|\b(since|in) the [\w-]+ round\b|\blanded\b", re.IGNORECASE)
    tests = re.compile(r"(?<!pytest )`?tests/test_\w+\.py")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _pages()
             for i, line in enumerate(p.read_text().splitlines(), 1) if history.search(line) or tests.search(line)]
    assert not found, "\n".join(found)


def test_every_benchmark_table_says_its_command_its_date_and_how_it_was_made():
    lines = (DOCS / "benchmarks.md").read_text().splitlines()
    stated = None
    unstated = []
    for i, line in enumerate(lines, 1):
        if line.startswith("Command: "):
            stated = line + " " + (lines[i] if i < len(lines) else "")
        elif line.startswith("## "):
            stated = None
        elif line.startswith("|---"):
            ok = (stated is not None and re.search(r"Date: \d{4}-\d{2}-\d{2}", stated)
                  and re.search(r"SIMULATED|REAL|[Mm]easured on", stated))
            if not ok:
                unstated.append(f"benchmarks.md:{i - 1}: {lines[i - 2][:80]}")
    assert not unstated, "tables without their command, date and kind of figure:\n" + "\n".join(unstated)
