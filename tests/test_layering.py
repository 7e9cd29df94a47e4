"""Dependencies point one way (docs/ARCHITECTURE.md, "Layers"): checked on the source, and on a live import.

The layer table below is the one of the docs, written down again on purpose: a change of layering
has to change both. Imports inside functions count as much as those at the top of a module: a lazy
import still makes the importing module depend on the imported one, it only moves the cost.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dvfs_mlops"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

# Lowest first: the package's folders are its layers (docs/ARCHITECTURE.md, "Layers"). A module may import from
# its own folder or a lower one. An entry names a top-level module or folder of the package.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "clocks", "settings"),
    ("hw",),
    ("model",),
    ("job",),
    ("mlops",),
    ("app", "integrations", "__main__"),
]


def _layer_of(module: str) -> int:
    name = module.removeprefix("dvfs_mlops").lstrip(".")
    best, best_len = None, -1
    for i, entries in enumerate(LAYERS):
        for e in entries:
            if (name == e or name.startswith(e + ".")) and len(e) > best_len:
                best, best_len = i, len(e)
    if best is None:
        raise AssertionError(f"{module} is in no layer of the table: add it (and to docs/ARCHITECTURE.md)")
    return best


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path], name: str) -> set[tuple[str, int]]:
    """(imported dvfs_mlops module, line) for every import statement, wherever it stands in the file."""
    found: set[tuple[str, int]] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from pkg import mod` depends on pkg.mod when that is a module, else on pkg itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == "dvfs_mlops" or not t.startswith("dvfs_mlops."):
                continue
            while t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t != name:
                found.add((t, node.lineno))
    return found


def _graph() -> dict[str, set[tuple[str, int]]]:
    modules = _modules()
    return {name: _imports(path, modules, name) for name, path in modules.items()}


def test_every_import_points_down_the_layer_table():
    upward = []
    for name, deps in _graph().items():
        for dep, line in sorted(deps):
            if _layer_of(dep) > _layer_of(name):
                upward.append(f"{name}:{line} imports {dep} (layer {_layer_of(dep) + 1} > {_layer_of(name) + 1})")
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


# Known loops, each to be removed, never added to: `workloads.tasks.load_task` reaches the readers
# (synthetic, glue_tsv) lazily while they import `Example`/`TaskSpec` from it. The fix (load_task in a
# module of its own above the readers) belongs to the workloads' owner; issue 12.
KNOWN_CYCLES = {
    ("dvfs_mlops.job.workloads.tasks", "dvfs_mlops.job.workloads.glue_tsv"),
    ("dvfs_mlops.job.workloads.tasks", "dvfs_mlops.job.workloads.synthetic"),
}


def test_no_import_cycles():
    graph = {name: {d for d, _ in deps} for name, deps in _graph().items()}
    for lazy, back in KNOWN_CYCLES:
        assert back in graph[lazy], f"{lazy} -> {back} is gone: remove it from KNOWN_CYCLES"
        graph[lazy].discard(back)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_docs_list_the_same_layers():
    """docs/ARCHITECTURE.md writes the table down as `N. `entry`, `entry`: ...` lines; they must agree."""
    text = DOC.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    documented: list[tuple[str, ...]] = []
    for m in re.finditer(r"^(\d+)\. (.+?):", section, re.MULTILINE):
        entries = re.findall(r"`([^`]+)`", m.group(2))
        documented.append(tuple(e.removesuffix(".py").removesuffix("/").replace("/", ".") for e in entries))
    assert documented == LAYERS


def test_every_module_has_a_layer():
    for name in _modules():
        if name != "dvfs_mlops":
            _layer_of(name)


PURE = ["dvfs_mlops.hw", "dvfs_mlops.hw.device", "dvfs_mlops.hw.guard", "dvfs_mlops.hw.placement",
        "dvfs_mlops.hw.jetson", "dvfs_mlops.hw.ina3221", "dvfs_mlops.hw.sysfs", "dvfs_mlops.hw.nvml",
        "dvfs_mlops.hw.sim", "dvfs_mlops.hw.clockd.protocol", "dvfs_mlops.hw.clockd.client", "dvfs_mlops.hw.clockd.server",
        "dvfs_mlops.model.governor.policies", "dvfs_mlops.model.governor.objectives",
        "dvfs_mlops.model.governor.dataset", "dvfs_mlops.model.governor.search", "dvfs_mlops.model.governor.policy_tree", "dvfs_mlops.model.curve", "dvfs_mlops.job.refine",
        "dvfs_mlops.model.governor.transfer"]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_neither_torch_nor_mlflow(module):
    """Importing a device backend or the governor's logic loads neither torch nor MLflow (both come lazily)."""
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'mlflow', 'transformers', 'optuna'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# ---- the house: what a newcomer can count on ---------------------------------------------------------

def test_few_modules_at_the_top_of_the_package():
    """The folders are the layers: at most 8 modules sit beside them at the top of dvfs_mlops/."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node


def test_no_function_is_over_100_lines_or_takes_more_than_12_parameters():
    """Click commands included: a command takes one typed object per option group, not every option."""
    too_long, too_many = [], []
    for rel, fn in _functions():
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs] + ([a.vararg] if a.vararg else []) + ([a.kwarg] if a.kwarg else [])
        n = len([p for p in params if p.arg not in ("self", "cls")])
        if fn.end_lineno - fn.lineno + 1 > 100:
            too_long.append(f"{rel}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)")
        if n > 12:
            too_many.append(f"{rel}:{fn.lineno} {fn.name} ({n} parameters)")
    assert not too_long and not too_many, "\n".join(too_long + too_many)


def test_the_command_line_is_thin():
    """All CLI code together (the click layer: app/cli.py and its option groups) is at most 600 lines."""
    click_layer = [p for p in (PACKAGE / "app").glob("*.py") if "import click" in p.read_text()]
    lines = sum(len(p.read_text().splitlines()) for p in click_layer)
    assert lines <= 600, {p.name: len(p.read_text().splitlines()) for p in click_layer}


def test_settings_is_the_one_module_that_touches_the_environment():
    touching = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if re.search(r"\bos\.environ\b|\bos\.getenv\b|\bputenv\b",
                                                                                                  p.read_text()))
    assert touching == ["dvfs_mlops/settings.py"], touching

