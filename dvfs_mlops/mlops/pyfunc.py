"""Log a TreePolicy as a models-from-code pyfunc with its artifacts (policy.json, tree.txt, tree.png; leaf_curves.png
for a curve governor)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.model.governor import policy_tree
from dvfs_mlops.model.workload import WorkloadFeatures, feature_types

if TYPE_CHECKING:
    from sklearn.tree import DecisionTreeClassifier

# The pyfunc's code, shipped with every version: the model class and the stdlib-only decision code beside it.
CODE = Path(policy_tree.__file__).resolve().parent / "model_code.py"
TREE_CODE = Path(policy_tree.__file__).resolve()
# SHA-256 of earlier releases of model_code.py that decide exactly as this one (they differ only in the import line a
# source-tree run falls back to): versions registered with them are read directly too (`governor.load_governor`).
EARLIER_CODE_SHA256 = frozenset({
    "b72822c66f2baa16c2f1bb8107314bf2c5502672f602d86127c99b7c2c5698a5",  # dvfs_mlops/governor/model_code.py, before the layer folders
})
# ... and of earlier releases of policy_tree.py that decide exactly as this one.
EARLIER_TREE_SHA256 = frozenset({
    "a549c01532c98738ef4a3e17080ee78028995435aff5089cc436f2f796774ea6",  # with a copy of the feature list it did not use
    "5c05e706d8c1eb8a9d3d6b5265fd92203f940b0faa09ea66535b8ee9fccd8c05",  # before policies of configurations (GPU clock only)
})


def is_our_code(model_code: bytes, tree_code: bytes) -> bool:
    """A registered version's shipped code decides as this package's: policy_tree.py this one or an earlier release
    that decides alike, byte for byte, and model_code.py this one or an earlier release of the same body."""
    import hashlib

    if tree_code != TREE_CODE.read_bytes() and hashlib.sha256(tree_code).hexdigest() not in EARLIER_TREE_SHA256:
        return False
    return model_code == CODE.read_bytes() or hashlib.sha256(model_code).hexdigest() in EARLIER_CODE_SHA256


# Two workloads as the input example of every version (an encoder in fp32, a LoRA decoder in bf16).
_EXAMPLES = (
    WorkloadFeatures("encoder", 12, 768, 109_483_778, 71.3, 95.0, 109_483_778, "fp32"),
    WorkloadFeatures("decoder", 6, 128, 7_628_288, 12.8, 30.0, 98_560, "bf16"),
)
# A feature's type -> the MLflow column type of the signature.
_COLUMN_TYPES = {str: "string", int: "long", float: "double", bool: "boolean"}


def input_example() -> list[dict[str, Any]]:
    """Two rows, as records: MLflow saves a list of dicts as JSON itself. (A DataFrame example goes through
    MLflow's split-dict conversion, which raises a pandas deprecation warning under pandas 3.)"""
    return [features.as_row() for features in _EXAMPLES]


def signature(default_objective: str = "energy") -> Any:
    """The pyfunc's signature: one input column per feature (`WorkloadFeatures`, typed as declared; a feature with a
    default is optional: a row without it means that default, `policy_tree.feature_value`), the decision's columns
    (freq_mhz, decision_path; cpu_mhz and emc_mhz, optional: null for a GPU-only governor, the CPU and memory clocks of
    a governor of configurations), and the params `frequencies` and `objective`."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    types = feature_types()
    inputs = Schema([ColSpec(_COLUMN_TYPES[types[f.name]], f.name, required=f.default is dataclasses.MISSING)
                     for f in dataclasses.fields(WorkloadFeatures)])
    outputs = Schema([ColSpec("double", "freq_mhz"), ColSpec("string", "decision_path"),
                      ColSpec("double", "cpu_mhz", required=False), ColSpec("double", "emc_mhz", required=False)])
    params = ParamSchema([ParamSpec("frequencies", "double", default=[], shape=(-1,)),
                          ParamSpec("objective", "string", default=default_objective)])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def write_tree_artifacts(policy: Mapping[str, Any], out: Path, classifier: DecisionTreeClassifier | None = None, feature_names: list[str] | None = None) -> dict[str, str]:
    """policy.json, tree.txt and tree.png in `out`; returns the artifact map for log_model."""
    paths = {"policy": out / "policy.json", "tree_txt": out / "tree.txt", "tree_png": out / "tree.png"}
    paths["policy"].write_text(json.dumps(policy, indent=2, sort_keys=True))
    paths["tree_txt"].write_text(tree_text(policy["tree"], classifier, feature_names, policy.get("clocks_mhz"), policy.get("configurations")))
    plot_tree_png(policy, paths["tree_png"], classifier, feature_names)
    if policy.get("family") == "curve":  # the leaves' curves: what the governor believes, leaf by leaf
        from dvfs_mlops.model.governor.curve_tree import leaf_curves_plot

        paths["leaf_curves"] = out / "leaf_curves.png"
        leaf_curves_plot(dict(policy), paths["leaf_curves"])
    return {k: str(v) for k, v in paths.items()}


def tree_text(node: Mapping[str, Any], classifier: DecisionTreeClassifier | None = None, feature_names: list[str] | None = None,
              policy_clocks: list[float] | None = None, policy_configurations: list[list[float | None]] | None = None) -> str:
    if classifier is not None and hasattr(classifier, "classes_"):
        from sklearn.tree import export_text

        return export_text(classifier, feature_names=list(feature_names or []))
    lines: list[str] = []

    def walk(n: Mapping[str, Any], depth: int) -> None:
        pad = "|   " * depth + "|--- "
        if "freq_mhz" in n:
            lines.append(f"{pad}freq_mhz: {n['freq_mhz']:g}")
            return
        if "feature" not in n and policy_configurations is not None:  # a leaf of configurations: what energy picks
            columns = [tuple(None if v is None else float(v) for v in c) for c in policy_configurations]
            i = policy_tree._leaf_index({}, n, "energy", columns)  # as the policy decides (ties: the faster)
            lines.append(f"{pad}configuration (n={n.get('samples', '?')}) {policy_tree._configuration_label(columns[i])}: "
                         f"E/Emin {n['energy'][i]:.3f}, T/Tmaxn {n['time'][i]:.2f}")
            return
        if "feature" not in n:  # a curve leaf: its curve, and what the energy objective picks from it
            clocks = policy_clocks or []
            curve = ", ".join(f"{f:g}:{e:.3f}/{t:.2f}" for f, e, t in zip(clocks, n["energy"], n["time"]))
            lines.append(f"{pad}curve (n={n.get('samples', '?')}, MHz:E/Emin/T/Tmaxn) {curve}")
            return
        lines.append(f"{pad}{n['feature']} <= {n['threshold']:g}")
        walk(n["left"], depth + 1)
        lines.append(f"{pad}{n['feature']} >  {n['threshold']:g}")
        walk(n["right"], depth + 1)

    walk(node, 0)
    return "\n".join(lines) + "\n"


def plot_tree_png(policy: Mapping[str, Any], path: Path, classifier: DecisionTreeClassifier | None = None, feature_names: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 6))
    if classifier is not None and hasattr(classifier, "classes_"):
        from sklearn.tree import plot_tree

        plot_tree(classifier, feature_names=feature_names, class_names=[f"{float(c):g} MHz" for c in classifier.classes_],
                  filled=True, ax=ax, fontsize=8, impurity=False)
    else:
        ax.axis("off")
        ax.text(0.01, 0.99, tree_text(policy["tree"], policy_clocks=policy.get("clocks_mhz"), policy_configurations=policy.get("configurations")),
                family="monospace", va="top",
                fontsize=10 if policy.get("family") != "curve" else 6)
    ax.set_title(f"governor {policy.get('name', '')}: objective {policy.get('objective', 'energy')}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@contextlib.contextmanager
def _quiet_example_check() -> Iterator[None]:
    """MLflow logs "Validating input example against model signature" at INFO on every log_model that has both a
    signature and an example; the check itself still runs (a mismatch raises). Warnings and errors still pass."""
    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def log_governor(policy: Mapping[str, Any], *, registered_name: str | None, classifier: DecisionTreeClassifier | None = None,
                 feature_names: list[str] | None = None, extra_artifacts: Mapping[str, str] | None = None,
                 metrics: Mapping[str, float] | None = None, tags: Mapping[str, str] | None = None,
                 version_tags: Mapping[str, str] | None = None) -> Any:
    """Log (and optionally register) the governor in the active MLflow run; returns ModelInfo.

    `tags` go on the logged model; `version_tags` on the registered version (its objective, sweep, board family ...:
    what the registry and `load_governor` read), where one was registered."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        artifacts = write_tree_artifacts(policy, Path(tmp), classifier, feature_names)
        artifacts.update(extra_artifacts or {})
        with _quiet_example_check():
            info = mlflow.pyfunc.log_model(
                name="governor", python_model=str(CODE), code_paths=[str(TREE_CODE)], artifacts=artifacts,
                signature=signature(str(policy.get("objective", "energy"))), input_example=input_example(), registered_model_name=registered_name,
                pip_requirements=["mlflow", "pandas"], tags=dict(tags or {}), metadata={"objective": policy.get("objective", "energy")},
            )
    if metrics:
        mlflow.log_metrics(dict(metrics))
    if registered_name and version_tags and info.registered_model_version:
        from dvfs_mlops.mlops import tracking

        client = tracking.client()
        for k, v in version_tags.items():
            client.set_model_version_tag(registered_name, str(info.registered_model_version), k, v)
    return info
