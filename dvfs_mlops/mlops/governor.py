"""The one way to a governor: `load_governor(uri)` returns a `Governor`, its reference and the model that decides.

`dvfs-mlops finetune`, `DvfsCallback`, `evaluate` and the adaptive sweep's start all load it here. Default URI:
`models:/dvfs-governor@production` (the registry's name and alias, `registry/governor.yaml`).

Fast path: a registered version of our models-from-code pyfunc whose `model_code.py` and `policy_tree.py` are this
package's, byte for byte, decides exactly as `policy_tree` does on its policy.json. That file is then read directly,
without mlflow.pyfunc's loading machinery (environment checks, code import), and remembered while a SQLite store is
not written (`alias_cache.py`: such a decision imports no MLflow at all). Anything else (another URI form, other
code, any failure, which includes every error a user should see) goes through mlflow.pyfunc.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.model.curve import PowerPrior
from dvfs_mlops.model.workload import WorkloadFeatures

log = logging.getLogger(__name__)

_MODELS_URI = re.compile(r"models:/([^/@]+)(?:@([^/@]+)|/([^/@]+))")


@dataclasses.dataclass(frozen=True)
class GovernorRef:
    """Which governor: its URI and, for a registered version, its name, version, alias and tags."""

    uri: str
    name: str | None = None
    version: int | None = None
    alias: str | None = None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """uri, name, version, alias (what a decision reports; the tags stay out)."""
        return {"uri": self.uri, "name": self.name, "version": self.version, "alias": self.alias}

    def to_cache(self) -> dict[str, Any]:
        return {**self.to_dict(), "tags": dict(self.tags)}

    @classmethod
    def from_cache(cls, data: dict[str, Any]) -> GovernorRef:
        return cls(str(data["uri"]), data.get("name"), data.get("version"), data.get("alias"), dict(data.get("tags") or {}))

    @property
    def label(self) -> str:
        """`dvfs-governor v3 (@production)`, or the URI of an unregistered model."""
        if not self.name:
            return self.uri
        return f"{self.name} v{self.version}" + (f" (@{self.alias})" if self.alias else "")

    @property
    def device_profile(self) -> str | None:
        """The device profile the version was trained for (its tag), None where it does not say."""
        return self.tags.get(schema.TAG_VERSION_PROFILE) or None

    def power_prior_for(self, board: Board) -> PowerPrior | None:
        """The power prior the version carries (tag `power_prior`), where it was trained on this board's profile; None
        otherwise (another board's power curves say nothing about this one's) or when the tag is unreadable."""
        text = self.tags.get(schema.TAG_VERSION_POWER_PRIOR)
        if not text:
            return None
        if self.device_profile != board.profile:
            log.info("refine: governor's power prior is of %s, this device is %s; not used", self.device_profile, board.profile)
            return None
        try:
            return PowerPrior.from_json(text)
        except DvfsError as e:
            log.warning("refine: the governor's %s tag is unreadable (%s); refining without it", schema.TAG_VERSION_POWER_PRIOR, e)
            return None


class PolicyModel:
    """A registered governor's policy.json, deciding as its pyfunc (`model/governor/model_code.py`) does."""

    def __init__(self, policy: dict[str, Any]):
        self.policy = policy

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import pandas as pd

        from dvfs_mlops.model.governor import policy_tree

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        table = (params or {}).get("frequencies") or None
        objective = (params or {}).get("objective") or None
        return pd.DataFrame(policy_tree.decide_rows(self.policy, frame.to_dict(orient="records"), table, objective))


@dataclasses.dataclass(frozen=True)
class Governor:
    """A loaded governor: `ref` says which, `model` decides (a `PolicyModel`, or the MLflow pyfunc)."""

    ref: GovernorRef
    model: Any

    def decide(self, features: WorkloadFeatures | dict[str, Any], frequencies: Sequence[float],
               objective: str | None = None) -> tuple[float, str]:
        """(clock in MHz, the decision path) for a workload on a clock table.

        Args:
            features: the workload's features (`gpu_util_pct` measured at maxn).
            frequencies: the board's clock table; the choice is snapped to it.
            objective: energy, edp or max-slowdown:X for a curve governor (None: the one it was trained for).

        Raises:
            DvfsError: the model could not decide (named with its URI).
        """
        row = features.as_row() if isinstance(features, WorkloadFeatures) else dict(features)
        params: dict[str, Any] = {"frequencies": [float(f) for f in frequencies]}
        if objective:
            params["objective"] = objective
        try:
            out = self.model.predict(input_frame(self.model, [row]), params=params)
        except Exception as e:  # noqa: BLE001
            raise DvfsError(f"governor {self.ref.uri} could not decide for these features ({str(e).splitlines()[0][:200]})") from None
        path = str(out["decision_path"].iloc[0]) if "decision_path" in out else f"{out['freq_mhz'].iloc[0]:g} MHz"
        return float(out["freq_mhz"].iloc[0]), path

    def check_board(self, board: Board, strict: bool, say: Callable[[str], None]) -> None:
        """A governor trained for another device profile: an error with `strict`, else a warning.

        Raises:
            DvfsError: with `strict`, when the version was trained for another profile.
        """
        trained_for = self.ref.device_profile
        if trained_for and trained_for != board.profile:
            msg = f"governor {self.ref.uri} was trained for device profile {trained_for!r}, this device is {board.profile!r}"
            if strict:
                raise DvfsError(msg + " (--strict); retrain on this device or drop --strict")
            say(f"warning: {msg}; its clocks are snapped to this device's table")


def input_frame(model: Any, rows: list[dict[str, Any]]) -> Any:
    """The rows as the governor's input, with only the columns its signature declares: a version registered before
    `trainable_params` and `precision` existed would otherwise make MLflow warn about the extra inputs on every call
    (it ignores them either way). A model without a signature (our PolicyModel) gets every column."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    try:
        schema_ = model.metadata.get_input_schema()
        names = schema_.input_names() if schema_ is not None else None
    except AttributeError:
        names = None
    return frame[[c for c in frame.columns if c in names]] if names else frame


def default_uri() -> str:
    """`models:/<name>@<production alias>` of the registry's config."""
    from dvfs_mlops.mlops.registry import load_config

    cfg = load_config()
    return f"models:/{cfg.name}@{cfg.production}"


def load_governor(uri: str | None = None, *, direct: bool = True) -> Governor:
    """The governor at `uri` (default: the production alias), the fast way where it can be.

    Args:
        uri: a `models:/NAME@ALIAS` or `models:/NAME/VERSION` URI, or any URI mlflow.pyfunc loads.
        direct: read a version of our own pyfunc's policy.json directly (the fast path); False: always mlflow.pyfunc.

    Returns:
        The `Governor`.

    Raises:
        DvfsError: the tracking store is unreachable, no version has the alias or number, or the model cannot load.
    """
    from dvfs_mlops.mlops import alias_cache

    target = uri or default_uri()
    store = tracking.tracking_uri()
    if direct:
        hit = alias_cache.lookup(store, target)
        if hit is not None:
            ref = GovernorRef.from_cache(hit.meta)
            log.debug("governor %s: remembered (the store is unchanged since it was resolved)", ref.label)
            return Governor(ref, PolicyModel(hit.policy))
    stamp = alias_cache.store_stamp(store)
    c = tracking.check_reachable()  # an unreachable store is one clear line, whichever way the governor is loaded
    ref = _reference(c, target)
    if direct:
        try:
            policy = _shipped_policy(c, ref)
        except Exception as e:  # noqa: BLE001 - the pyfunc below says what is wrong, in its words
            log.debug("governor %s: no direct policy read (%s); loading it with mlflow.pyfunc", target, e)
            policy = None
        if policy is not None:
            log.debug("governor %s: policy.json read directly (its code is this package's)", ref.label)
            alias_cache.remember(store, target, stamp, alias_cache.CachedGovernor(policy, ref.to_cache()))
            return Governor(ref, PolicyModel(policy))
    return Governor(ref, _pyfunc(target))


def _reference(c: Any, target: str) -> GovernorRef:
    """Which version `target` names (its alias or number checked), or a bare reference for another URI form."""
    from dvfs_mlops.mlops.registry import alias_version, get_version

    m = _MODELS_URI.fullmatch(target)
    if m is None:
        return GovernorRef(target)
    name, alias, number = m.groups()
    if alias:
        mv = alias_version(c, name, alias)
        if mv is None:
            raise DvfsError(f"no {name} version has alias '{alias}'; register one with `dvfs-mlops train` (or `dvfs-mlops "
                            "registry bootstrap` for the published tree), then `dvfs-mlops registry promote VERSION`")
    else:
        mv = get_version(c, name, number)
    return GovernorRef(target, name, int(mv.version), alias, dict(mv.tags))


def _pyfunc(target: str) -> Any:
    import mlflow

    try:
        return mlflow.pyfunc.load_model(target)
    except Exception as e:  # noqa: BLE001
        raise DvfsError(f"cannot load governor {target}: {str(e).splitlines()[0][:200]}") from None


def _shipped_policy(c: Any, ref: GovernorRef) -> dict[str, Any] | None:
    """policy.json of a registered version whose code decides as this package's (`pyfunc.is_our_code`); None for any
    other model."""
    if ref.name is None or ref.version is None:
        return None
    import mlflow
    import yaml

    from dvfs_mlops.mlops.pyfunc import is_our_code

    with tempfile.TemporaryDirectory() as tmp:
        uri = c.get_model_version_download_uri(ref.name, str(ref.version))
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp))
        pf = (yaml.safe_load((local / "MLmodel").read_text()) or {}).get("flavors", {}).get("python_function", {})
        if pf.get("loader_module") != "mlflow.pyfunc.loaders.code_model" or not pf.get("model_code_path") or not pf.get("code"):
            return None
        shipped_code = local / Path(pf["model_code_path"]).name
        shipped_tree = local / pf["code"] / "policy_tree.py"
        if not (shipped_code.is_file() and shipped_tree.is_file()):
            return None
        if not is_our_code(shipped_code.read_bytes(), shipped_tree.read_bytes()):
            return None
        policy_file = local / pf.get("artifacts", {}).get("policy", {}).get("path", "")
        return json.loads(policy_file.read_text()) if policy_file.is_file() else None
