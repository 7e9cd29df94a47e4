"""Evaluate a governor policy file (policy.json): nested threshold splits ending in a clock or a curve.

Standard library only: this file also ships inside every registered model (MLflow `code_paths`),
so loading a governor needs mlflow, pandas and this, and unpickles nothing.

    {"format": "dvfs-governor-policy/1", "tree": NODE, ...metadata}
    NODE = {"feature": "num_layers", "threshold": 7, "left": NODE, "right": NODE}   # left: value <= threshold
         | {"freq_mhz": 612.0}                                                      # classifier leaf
         | {"energy": [...], "time": [...], "time_hi": [...], "samples": 5}          # curve leaf

A curve policy (`"family": "curve"`) also has `"clocks_mhz": [...]`: its leaves hold, per clock, the
mean energy normalised per workload (E/E_min), the mean time against maxn (T/T_maxn) and the
largest such time in the leaf. The objective is applied at decision time (`objective=` or the
policy's own "objective"): energy, edp, or max-slowdown:X (least energy whose `time_hi` <= X).

A policy of configurations (`"family": "configurations"`) has `"configurations": [[gpu, cpu, emc], ...]`
(MHz; null where a clock is not part of them) where a curve policy has `clocks_mhz`, and curve
leaves over those configurations, applied the same way. Its decisions carry the CPU and memory
clocks too (`decide_configuration`; `decide_rows`' cpu_mhz and emc_mhz, null for a GPU-only policy).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT = "dvfs-governor-policy/1"

def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def feature_value(row: Mapping[str, Any], feature: str) -> float:
    """A row's value for a split feature; model_type is seen as is_decoder (0/1), precision as half_precision (0/1).

    The two later columns have defaults a caller from before them means: no trainable_params is a full fine-tune
    (all of num_params), no precision is fp32."""
    if feature == "is_decoder":
        return 1.0 if str(row.get("model_type", "")).lower() == "decoder" else 0.0
    if feature == "half_precision":
        precision = row.get("precision")
        return 0.0 if _missing(precision) or str(precision).lower() == "fp32" else 1.0
    value: Any = row.get(feature)
    if feature == "trainable_params" and _missing(value):
        value = row.get("num_params")
    if _missing(value):
        raise ValueError(f"the governor needs feature {feature!r}, which is missing from the input")
    return float(value)


def parse_objective(text: str) -> tuple[str, float | None]:
    """("energy" | "edp" | "max-slowdown", X or None); a bad name raises ValueError."""
    t = str(text).strip().lower()
    if t in ("energy", "edp"):
        return t, None
    if t.startswith("max-slowdown:"):
        try:
            x = float(t.split(":", 1)[1])
        except ValueError:
            x = float("nan")
        if x >= 1.0:
            return "max-slowdown", x
    raise ValueError(f"unknown objective {text!r}; valid: energy, edp, max-slowdown:X (X >= 1)")


def configurations(policy: Mapping[str, Any]) -> list[tuple[float, float | None, float | None]] | None:
    """A policy of configurations' (GPU, CPU, EMC) columns; None for a GPU-only policy."""
    if "configurations" not in policy:
        return None
    return [(float(c[0]), *(None if v is None else float(v) for v in c[1:3])) for c in policy["configurations"]]  # type: ignore[misc]


def _configuration_label(c: Sequence[float | None]) -> str:
    return " / ".join(f"{n} {v:g}" for n, v in zip(("GPU", "CPU", "EMC"), c) if v is not None) + " MHz"


def _leaf_index(policy: Mapping[str, Any], leaf: Mapping[str, Any], objective: str | None,
                columns: Sequence[Any]) -> int:
    """The column a curve leaf picks under `objective` (ties: the higher clocks)."""
    kind, x = parse_objective(objective or policy.get("objective", "energy"))
    energy, time = leaf["energy"], leaf["time"]
    time_hi = leaf.get("time_hi", time)
    up = [tuple(-(v or 0.0) for v in c) if isinstance(c, tuple) else (-c,) for c in columns]
    n = len(columns)
    if kind == "edp":
        cost = [e * t for e, t in zip(energy, time)]
        ok = list(range(n))
    else:
        cost = list(energy)
        ok = [i for i in range(n) if kind == "energy" or time_hi[i] <= x * (1 + 1e-9)]  # type: ignore[operator]
    if not ok:  # nothing meets the bound: the fastest configuration is the closest
        return min(range(n), key=lambda j: (time_hi[j], *up[j]))
    return min(ok, key=lambda j: (cost[j], *up[j]))


def decide_configuration(policy: Mapping[str, Any], row: Mapping[str, Any],
                         objective: str | None = None) -> tuple[tuple[float, float | None, float | None], list[str]]:
    """((GPU, CPU, EMC) clocks in MHz, the path through the tree): a GPU-only policy's CPU and EMC are None."""
    table = configurations(policy)
    if table is None:
        freq, path = decide(policy, row, objective)
        return (freq, None, None), path
    node, path = _walk(policy, row)
    i = _leaf_index(policy, node, objective, table)
    note = (f"leaf ({node.get('samples', '?')} workloads) at {_configuration_label(table[i])}: E/Emin {node['energy'][i]:.3f}, "
            f"T/Tmaxn {node['time'][i]:.3f}")
    return table[i], [*path, note]


def leaf_choice(policy: Mapping[str, Any], leaf: Mapping[str, Any], objective: str | None = None) -> tuple[float, str]:
    """The clock a curve leaf picks under `objective`, and the leaf's figures at that clock."""
    clocks = [float(f) for f in policy["clocks_mhz"]]
    i = _leaf_index(policy, leaf, objective, clocks)
    note = (f"leaf curve ({leaf.get('samples', '?')} workloads) at {clocks[i]:g} MHz: E/Emin {leaf['energy'][i]:.3f}, "
            f"T/Tmaxn {leaf['time'][i]:.3f}")
    return clocks[i], note


def decide(policy: Mapping[str, Any], row: Mapping[str, Any], objective: str | None = None) -> tuple[float, list[str]]:
    """(clock in MHz, the path through the tree as readable steps; a curve leaf adds its figures). A policy of
    configurations gives its configuration's GPU clock (`decide_configuration` gives all three)."""
    if "configurations" in policy:
        (freq, _, _), path = decide_configuration(policy, row, objective)
        return freq, path
    node, path = _walk(policy, row)
    if "freq_mhz" in node:
        return float(node["freq_mhz"]), path
    freq, note = leaf_choice(policy, node, objective)
    return freq, [*path, note]


def _walk(policy: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
    """(the leaf a row reaches, the path to it as readable steps)."""
    node = policy["tree"]
    path: list[str] = []
    while "feature" in node:
        feature, threshold = node["feature"], float(node["threshold"])
        value = feature_value(row, feature)
        shown = {"is_decoder": f"model_type={row.get('model_type')}", "half_precision": f"precision={row.get('precision') or 'fp32'}"
                 }.get(feature, f"{feature}={value:g}")
        if value <= threshold:
            path.append(f"{shown} <= {threshold:g}")
            node = node["left"]
        else:
            path.append(f"{shown} > {threshold:g}")
            node = node["right"]
    return node, path


def snap(freq_mhz: float, table: Sequence[float] | None) -> float:
    """The table's clock nearest to `freq_mhz` (ties go up); unchanged without a table."""
    if not table:
        return float(freq_mhz)
    return float(min(table, key=lambda f: (abs(float(f) - freq_mhz), -float(f))))


def explain(path: Sequence[str], freq_mhz: float) -> str:
    return (", ".join(path) + " -> " if path else "") + f"{freq_mhz:g} MHz"


def decide_rows(policy: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                table: Sequence[float] | None = None, objective: str | None = None) -> dict[str, list[Any]]:
    """The governor's output columns for input rows: the pyfunc and the launcher's direct read both call this.

    freq_mhz (snapped to `table`), decision_path, and cpu_mhz and emc_mhz: a policy of configurations' CPU and memory
    clocks (None for a GPU-only policy, or where its configurations leave the clock alone).
    `objective` (energy | edp | max-slowdown:X) applies to a curve policy or one of configurations; a classifier
    policy was trained for one objective and refuses another."""
    if objective and "clocks_mhz" not in policy and "configurations" not in policy:
        own = str(policy.get("objective", "energy"))
        if parse_objective(objective) != parse_objective(own):
            raise ValueError(f"this governor picks clocks for objective {own!r} only (a classifier tree); "
                             f"train a curve governor to choose {objective!r} at decision time")
    freqs: list[float] = []
    paths: list[str] = []
    cpus: list[float | None] = []
    emcs: list[float | None] = []
    for row in rows:
        (f, cpu, emc), path = decide_configuration(policy, row, objective)
        f = snap(f, table)
        freqs.append(f)
        cpus.append(cpu)
        emcs.append(emc)
        paths.append(explain(path, f) if cpu is None and emc is None else
                     (", ".join(path) + " -> " if path else "") + _configuration_label((f, cpu, emc)))
    return {"freq_mhz": freqs, "decision_path": paths, "cpu_mhz": cpus, "emc_mhz": emcs}


def tree_depth(node: Mapping[str, Any]) -> int:
    return 1 + max(tree_depth(node["left"]), tree_depth(node["right"])) if "feature" in node else 0


def features_used(node: Mapping[str, Any]) -> set[str]:
    """The features a tree splits on (empty for a constant, depth-0 tree)."""
    if "feature" not in node:
        return set()
    return {node["feature"]} | features_used(node["left"]) | features_used(node["right"])
