"""Types at the seams (docs/ARCHITECTURE.md): the package's signatures say what crosses them, and mypy agrees.

Three checks on the source, and what mypy found fixed: few parameters are annotated bare `Any` (`Any` or `Any | None`; `dict[str, Any]`,
`*args: Any` and `**kwargs: Any` are not bare), none of them a seam (the device, board, job, workload, session,
governor, decision or the MLflow client), and mypy (pyproject.toml [tool.mypy], default strictness) finds no error
in dvfs_mlops/.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from dvfs_mlops.hw.jetson import JetsonDevice
from dvfs_mlops.hw.meter import EnergyReport

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dvfs_mlops"

MAX_BARE_ANY = 60
# The names a seam's value goes by in this package's signatures and records; `c` is the MLflow client everywhere.
SEAM_NAMES = {"device", "dev", "board", "job", "workload", "session", "governor", "decision", "client", "c"}
_BARE = {"Any", "Any|None", "None|Any", "Optional[Any]", "typing.Any", "typing.Optional[typing.Any]"}


def _is_bare_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and ast.unparse(annotation).replace(" ", "").strip("'\"") in _BARE


def _parameters() -> list[tuple[str, int, str, ast.arg]]:
    """(file, line, function, parameter) of every named parameter of every function in the package (not *args, **kwargs)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    found.append((str(path.relative_to(ROOT)), node.lineno, node.name, a))
    return found


def _record_fields() -> list[tuple[str, int, str, ast.expr]]:
    """(file, line, name, annotation) of every annotated attribute in a class body (dataclass fields, protocols)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        found.append((str(path.relative_to(ROOT)), item.lineno, item.target.id, item.annotation))
    return found


def test_few_parameters_are_annotated_bare_any():
    bare = [f"{f}:{line} {fn}({a.arg})" for f, line, fn, a in _parameters() if _is_bare_any(a.annotation)]
    assert len(bare) <= MAX_BARE_ANY, f"{len(bare)} parameters annotated bare Any (at most {MAX_BARE_ANY}):\n" + "\n".join(bare)


def test_no_seam_is_annotated_any():
    """A device, board, job, workload, session, governor, decision or MLflow client is never `Any` in a signature or a
    record: go-to-definition from a command reaches the type."""
    params = [f"{f}:{line} {fn}({a.arg})" for f, line, fn, a in _parameters()
              if a.arg in SEAM_NAMES and _is_bare_any(a.annotation)]
    fields = [f"{f}:{line} {name}" for f, line, name, ann in _record_fields() if name in SEAM_NAMES and _is_bare_any(ann)]
    assert not params + fields, "seams annotated Any:\n" + "\n".join(params + fields)


def test_the_bare_any_check_sees_what_it_counts():
    """The checks above read annotations as the source writes them: a bare `Any` and `Any | None` count, a container of
    Any does not."""
    tree = ast.parse("def f(a: Any, b: Any | None, c: 'Any', d: dict[str, Any], e: list[Any] | None, *args: Any): ...")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert [_is_bare_any(a.annotation) for a in fn.args.args] == [True, True, True, False, False]


@pytest.mark.timeout(900)  # a cold cache reads torch's and transformers' types: one to two minutes on 2 cores
def test_mypy_finds_no_error_in_the_package():
    """`make lint`'s mypy run (pyproject.toml [tool.mypy]), with the interpreter of the suite."""
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("Success: no issues found"), out.stdout[-2000:]


def test_a_jetson_session_judges_a_mean_clock_like_every_backend(orin6):
    """`FreqSession._held` judges a report's mean clock against the pin; the jetson session kept its open EMC files
    under the same name, so judging one raised "'list' object is not callable" (mypy: incompatible override)."""
    with JetsonDevice(sample_hz=200).session(1300.5) as s:
        pass
    report = EnergyReport(1.0, 1.0, 1.0, {"VDD_GPU_SOC": 1.0}, 1.0, 1.0, None, 1, True, clock_mhz_measured=1224.0)
    assert s._held(report) is False  # one table step below the pin
    report.clock_mhz_measured = 1300.5
    assert s._held(report) is True
