"""The README is the first screen a user reads: short, its links and picture there, its two commands the ones the
Makefile and CI run. What it leaves out is on the documentation site (tests/test_docs_site.py builds it)."""
from __future__ import annotations

import re

from tests.conftest import REPO

README = REPO / "README.md"


def _text() -> str:
    return README.read_text()


def test_the_readme_is_at_most_250_lines():
    assert len(_text().splitlines()) <= 250


def test_every_relative_link_and_image_of_the_readme_exists():
    targets = re.findall(r"\]\(([^)\s]+)\)", _text())
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+://", t) and not t.startswith("#")]
    assert local, "the README links the documentation"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing


def test_the_readme_picture_is_labelled_simulated_and_its_script_is_in_the_repository():
    images = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", _text())
    assert images, "a picture of the energy curve"
    for alt, path in images:
        assert "SIMULATED" in alt and (REPO / path).is_file(), (alt, path)
    script = REPO / "docs" / "figures" / "energy_curve.py"
    assert script.is_file() and "energy-curve.png" in script.read_text()


def test_the_two_commands_are_the_makefile_s_and_ci_runs_the_readme_s_test_command():
    block = _text().split("## Install", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"], commands
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.MULTILINE) and re.search(r"^test:", makefile, re.MULTILINE)
    assert (REPO / ".ci" / "run").read_text().rstrip().splitlines()[-1] == "make test"


def test_the_readme_shows_a_real_board_as_the_clock_service_then_commands_as_yourself():
    section = _text().split("## A real board", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) <= 5 and "clockd install" in lines[1] and lines[1].startswith("sudo ")
    assert all(not line.startswith("sudo") for line in lines[2:]), "sweep and finetune run as yourself"
    assert any("sweep" in line for line in lines) and any("finetune" in line for line in lines)


def test_the_readme_narrates_no_tests_or_history():
    text = _text()
    assert not re.search(r"tests/test_\w+\.py|\bused to\b|\bsince issue\b|\blanded\b", text)
