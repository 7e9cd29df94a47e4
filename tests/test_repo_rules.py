"""Rules of the repository's layout, and the closing line of a test run.

- tests/ and benchmarks/ never import each other; both may import testkit/, and testkit/ imports neither (what
  both need lives in testkit/).
- `make test` ends with one line naming each group of skipped tests and the command that enables it
  (testkit/skips.py, registered from tests/conftest.py).
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.skips import RULES, classify, summary_line

REPO = Path(__file__).resolve().parents[1]
# folder -> the top-level packages its files must not import
FORBIDDEN = {"tests": ("benchmarks",), "benchmarks": ("tests",), "testkit": ("tests", "benchmarks")}


def _imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in `source`: import, from-import, and importlib.import_module or
    __import__ of a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            found.append((node.lineno, node.args[0].value))  # type: ignore[attr-defined]
    return found


def _dynamic_import(call: ast.Call) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    return (name in ("import_module", "__import__") and bool(call.args) and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str))


def test_the_import_checker_sees_every_kind_of_import():
    source = textwrap.dedent("""
        import benchmarks.common
        from tests.conftest import REPO
        from . import sibling

        def f():
            import importlib
            return importlib.import_module("benchmarks.prior_robustness"), __import__("tests")
    """)
    assert _imports(source) == [(2, "benchmarks.common"), (3, "tests.conftest"), (7, "importlib"),
                                (8, "benchmarks.prior_robustness"), (8, "tests")]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_tests_benchmarks_and_testkit_import_only_what_they_may(folder):
    files = sorted((REPO / folder).rglob("*.py"))
    assert len(files) >= 3, f"{folder}/ has no Python files here"
    bad = [f"{path.relative_to(REPO)}:{line} imports {module}"
           for path in files for line, module in _imports(path.read_text())
           if module.split(".")[0] in FORBIDDEN[folder]]
    assert not bad, f"{folder}/ must not import {' or '.join(FORBIDDEN[folder])} (move what both use to testkit/): {bad}"


# -- the closing line: what was skipped -----------------------------------------------------------------------------

FUSE_APT = "apt-get install -y fuse3 libfuse3-3"
PG_APT = "apt-get install -y postgresql"
BROWSER_APT = "apt-get install -y chromium chromium-driver"
DEV = "pip install -e '.[dev]'"


@pytest.mark.parametrize(("reason", "group", "command"), [
    # tests/conftest.py's kernel-tree fixtures, with testkit/fakes/kernelfs.py's reasons
    ("FUSE kernel tree unavailable: no fusermount3 (apt-get install fuse3)", "FUSE sysfs", FUSE_APT),
    ("FUSE kernel tree unavailable: libfuse3 cannot be loaded: libfuse3.so.3: cannot open (apt-get install libfuse3-3)",
     "FUSE sysfs", FUSE_APT),
    ("mount failed: Transport endpoint is not connected", "FUSE sysfs", FUSE_APT),  # tests/test_kernelfs.py, bare
    ("the checks before the mfusepy import fail here already", "FUSE sysfs", FUSE_APT),
    ("FUSE kernel tree unavailable: mfusepy is not installed (pip install mfusepy)", "FUSE sysfs", DEV),
    ("no /dev/fuse (FUSE is not available in this kernel or container)", "FUSE sysfs",
     "a machine with /dev/fuse (docker run --device /dev/fuse --cap-add SYS_ADMIN)"),
    # testkit/fakes/pgserver.py
    ("PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)", "PostgreSQL fleet", PG_APT),
    ("running as root and there is no 'postgres' user to own the cluster (initdb refuses root)", "PostgreSQL fleet", PG_APT),
    ("the PostgreSQL driver is missing: pip install 'psycopg[binary]' (in the dev and fleet extras)", "PostgreSQL fleet", DEV),
    # tests/test_ui_browser.py
    ("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)", "MLflow-UI browser", BROWSER_APT),
    ("needs selenium (pip install -e '.[dev]')", "MLflow-UI browser", DEV),
    # tests/test_tasks.py
    (("real GLUE samples not found: set DVFS_GLUE_SAMPLES to a folder holding SST-2/dev.tsv, RTE/dev.tsv, ... (it is unset); "
      "the quirk tests on files the tests write run regardless"), "real GLUE samples", "export DVFS_GLUE_SAMPLES=DIR"),
    # anything else: its first words, no command
    ("system lock locations are used only as root", "system lock locations are used", None),
    ("needs the mlflow entry point beside this interpreter", "needs the mlflow entry point", None),
    ("", "no reason given", None),
])
def test_each_skip_reason_has_its_group_and_command(reason, group, command):
    assert classify(reason) == (group, command)


def test_the_apt_get_commands_are_the_ones_ci_runs():
    """Each apt-get line the summary prints installs exactly the packages `.ci/run` installs for that group."""
    ci = (REPO / ".ci" / "run").read_text()
    installed = {tuple(m.split()) for m in re.findall(r"apt-get install -y -qq ([\w .-]+?) >", ci)}
    printed = {tuple(rule.command.removeprefix("apt-get install -y ").split()) for rule in RULES
               if rule.command.startswith("apt-get install")}
    assert printed == installed == {("fuse3", "libfuse3-3"), ("postgresql",), ("chromium", "chromium-driver")}


def test_the_summary_counts_each_group_in_order_with_its_commands():
    reasons = ["needs the mlflow entry point beside this interpreter",
               "PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)",
               "FUSE kernel tree unavailable: no fusermount3 (apt-get install fuse3)",
               "PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)",
               "FUSE kernel tree unavailable: mfusepy is not installed (pip install mfusepy)",
               "FUSE kernel tree unavailable: no fusermount3 (apt-get install fuse3)"]
    assert summary_line(reasons) == (f"skipped: FUSE sysfs (3 tests: {FUSE_APT}; {DEV}), PostgreSQL fleet (2 tests: {PG_APT}), "
                                     "needs the mlflow entry point (1 test)")
    assert summary_line([]) == "skipped: none"


def test_the_plugin_is_registered_for_the_suite(request):
    assert request.config.pluginmanager.has_plugin("testkit.skips")


INNER_TESTS = '''
import pytest


def test_passes():
    pass


@pytest.mark.skip(reason="PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)")
def test_fleet():
    pass


def test_claims():
    pytest.skip("running as root and there is no 'postgres' user to own the cluster (initdb refuses root)")


@pytest.fixture
def kernel():
    pytest.skip("FUSE kernel tree unavailable: no fusermount3 (apt-get install fuse3)")


def test_kernel(kernel):
    pass


def test_root_only():
    pytest.skip("system lock locations are used only as root")


@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_expected_failure():
    assert False
'''


def _run_inner(tmp_path: Path, source: str, *args: str) -> list[str]:
    """Output lines of a pytest run (as `make test` runs it: -q, -ra) of one test file with the plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -ra\n")
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    env.pop("PYTEST_ADDOPTS", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "testkit.skips", "-p", "no:cacheprovider", *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.rstrip("\n").splitlines()


def test_the_run_ends_with_the_skipped_groups_under_xdist(tmp_path):
    """Under `-n 2` the workers run the tests and the controller prints the line, after pytest's own counts."""
    lines = _run_inner(tmp_path, INNER_TESTS, "-n", "2")
    assert re.match(r"1 passed, 4 skipped, 1 xfailed in [\d.]+s", lines[-2]), lines
    assert lines[-1] == (f"skipped: FUSE sysfs (1 test: {FUSE_APT}), PostgreSQL fleet (2 tests: {PG_APT}), "
                         "system lock locations are used (1 test)"), lines
    assert sum(line.startswith("skipped: ") for line in lines) == 1, lines  # the controller only, not each worker


def test_a_run_without_skips_says_none(tmp_path):
    lines = _run_inner(tmp_path, "def test_passes():\n    pass\n")
    assert re.match(r"1 passed in [\d.]+s", lines[-2]) and lines[-1] == "skipped: none", lines
