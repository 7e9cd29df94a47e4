"""`python -m benchmarks`: --help lists every suite, an unknown suite is one line and exit 2 (no traceback), and the
suite list names a module that exists for each. The suites themselves are `make bench`'s, not timed tests."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _suites() -> dict[str, str]:
    """The SUITES table of benchmarks/__main__.py, read as text (tests never import benchmarks)."""
    text = (REPO / "benchmarks" / "__main__.py").read_text()
    return dict(re.findall(r'^    "(\w+)": \(.*?"(benchmarks\.\w+)"\),?$', text, flags=re.MULTILINE | re.DOTALL))


def test_help_lists_every_suite():
    r = _bench("--help")
    assert r.returncode == 0 and r.stderr == ""
    listed = re.findall(r"^  (\w+)  ", r.stdout, flags=re.MULTILINE)
    assert listed == list(_suites()) and {"governor", "optuna", "curves", "fleet", "clockd"} <= set(listed)
    assert _bench("-h").stdout == r.stdout


def test_an_unknown_suite_is_one_line_naming_the_valid_ones():
    r = _bench("governor", "nonsense")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "unknown benchmark suite(s) nonsense; valid: meter, sim," in r.stderr


def test_every_suite_names_a_module_with_a_run_function():
    suites = _suites()
    assert len(suites) == 16
    for key, module in suites.items():
        source = (REPO / (module.replace(".", "/") + ".py")).read_text()
        assert re.search(r"^def run\(", source, flags=re.MULTILINE), f"{key}: {module} has no run()"
