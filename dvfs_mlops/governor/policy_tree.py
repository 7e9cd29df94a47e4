"""Evaluate a governor policy file (policy.json): nested threshold splits ending in a clock.

Standard library only: this file also ships inside every registered model (MLflow `code_paths`),
so loading a governor needs mlflow, pandas and this, and unpickles nothing.

    {"format": "dvfs-governor-policy/1", "tree": NODE, ...metadata}
    NODE = {"feature": "num_layers", "threshold": 7, "left": NODE, "right": NODE}   # left: value <= threshold
         | {"freq_mhz": 612.0}
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT = "dvfs-governor-policy/1"
INPUT_COLUMNS = ("model_type", "num_layers", "hidden_size", "num_params", "avg_seq_len", "gpu_util_pct")


def feature_value(row: Mapping[str, Any], feature: str) -> float:
    """A row's value for a split feature; model_type is seen as is_decoder (0/1)."""
    if feature == "is_decoder":
        return 1.0 if str(row.get("model_type", "")).lower() == "decoder" else 0.0
    value = row.get(feature)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise ValueError(f"the governor needs feature {feature!r}, which is missing from the input")
    return float(value)


def decide(policy: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[float, list[str]]:
    """(clock in MHz, the path through the tree as readable steps)."""
    node = policy["tree"]
    path: list[str] = []
    while "freq_mhz" not in node:
        feature, threshold = node["feature"], float(node["threshold"])
        value = feature_value(row, feature)
        shown = f"model_type={row.get('model_type')}" if feature == "is_decoder" else f"{feature}={value:g}"
        if value <= threshold:
            path.append(f"{shown} <= {threshold:g}")
            node = node["left"]
        else:
            path.append(f"{shown} > {threshold:g}")
            node = node["right"]
    return float(node["freq_mhz"]), path


def snap(freq_mhz: float, table: Sequence[float] | None) -> float:
    """The table's clock nearest to `freq_mhz` (ties go up); unchanged without a table."""
    if not table:
        return float(freq_mhz)
    return float(min(table, key=lambda f: (abs(float(f) - freq_mhz), -float(f))))


def explain(path: Sequence[str], freq_mhz: float) -> str:
    return (", ".join(path) + " -> " if path else "") + f"{freq_mhz:g} MHz"


def decide_rows(policy: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                table: Sequence[float] | None = None) -> dict[str, list[Any]]:
    """The governor's output columns for input rows: the pyfunc and the launcher's direct read both call this."""
    freqs: list[float] = []
    paths: list[str] = []
    for row in rows:
        f, path = decide(policy, row)
        f = snap(f, table)
        freqs.append(f)
        paths.append(explain(path, f))
    return {"freq_mhz": freqs, "decision_path": paths}


def tree_depth(node: Mapping[str, Any]) -> int:
    return 0 if "freq_mhz" in node else 1 + max(tree_depth(node["left"]), tree_depth(node["right"]))

