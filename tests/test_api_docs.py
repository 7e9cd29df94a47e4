"""docs/API.md documents every argument of the public entry points (and nothing that no longer exists)."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"


def _section(heading: str) -> str:
    text = API_DOC.read_text()
    start = text.index(f"# {heading}")
    nxt = text.find("\n## ", start + 1)
    return text[start: nxt if nxt != -1 else len(text)]


def _entry_points():
    from dvfs_mlops.hw import open_device
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.device import FreqSession
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.mlops.governor import load_governor
    from dvfs_mlops.model.governor.search import run_search

    return [("`dvfs_mlops.hw.open_device`", open_device),
            ("`FreqSession`", FreqSession.__init__),
            ("`Board`", board_of),
            ("`load_governor`", load_governor),
            ("`DvfsCallback`", DvfsCallback.__init__),
            ("`run_search`", run_search)]


@pytest.mark.parametrize("index", range(6))
def test_every_argument_is_documented(index):
    heading, fn = _entry_points()[index]
    section = _section(heading)
    names = [p for p in inspect.signature(fn).parameters if p not in ("self", "device")]
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"docs/API.md, {heading}: undocumented arguments {missing}"


def test_documented_errors_exist():
    from dvfs_mlops import errors
    from dvfs_mlops.hw import placement

    table = _section("dvfs-mlops public API")
    names = re.findall(r"^\| `(\w+)`", table, flags=re.MULTILINE)
    assert names, "the error table is empty"
    for name in names:
        cls = getattr(errors, name, None) or getattr(placement, name, None)
        assert cls is not None and issubclass(cls, errors.DvfsError), f"{name} is not a DvfsError"


def test_pyfunc_columns_are_the_feature_columns():
    from dvfs_mlops.model.workload import FEATURE_COLUMNS

    section = _section("The governor pyfunc")
    assert all(f"`{c}`" in section for c in FEATURE_COLUMNS)
