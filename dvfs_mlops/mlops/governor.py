"""The one way to a governor: `load_governor(uri)` returns a `Governor`, its reference and the model that decides.

`dvfs-mlops finetune`, `DvfsCallback`, `evaluate` and the adaptive sweep's start all load it here. Default URI:
`models:/dvfs-governor@production` (the registry's name and alias, `registry/governor.yaml`). Given the board,
the default is its family's production version (`production-<family>`; for the AGX Orin 64 GB `production`, which
moves with it), and a version of another family is refused unless `allow_other_board` (`NoGovernorForBoard`,
`OtherBoardGovernor`). `governor_for_board` is what a launcher asks: the family's governor, another family's where
allowed, or none, in which case the job refines from the curve model (`BoardGovernor`).

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
import math
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import Board, board_family
from dvfs_mlops.mlops import schema, tracking
from dvfs_mlops.model.curve import PowerPrior
from dvfs_mlops.model.workload import WorkloadFeatures

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient
    
    from dvfs_mlops.mlops.registry import RegistryConfig

log = logging.getLogger(__name__)


class NoAliasError(DvfsError):
    """No version of the registered model holds the alias a URI names."""


class NoGovernorForBoard(DvfsError):
    """No production governor of this board's family (`dvfs-mlops calibrate` makes one).

    Attributes:
        family: the board's family.
        found: what the registry has instead ("registered: jetson-agx-orin-64gb v3", or what `production` holds).
    """

    def __init__(self, family: str, found: str):
        self.family, self.found = family, found
        super().__init__(f"no production governor for {family} ({found}); `dvfs-mlops calibrate` makes one for this board, "
                         "--allow-other-board uses another board's")


class OtherBoardGovernor(DvfsError):
    """The governor asked for is of another board family, and `allow_other_board` was not given."""


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
    def family(self) -> str | None:
        """The board family the version belongs to (`registry.version_family`); None for an unregistered model."""
        if self.name is None:
            return None
        from dvfs_mlops.mlops.registry import version_family

        return version_family(self.tags)

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

    def predict(self, model_input: pd.DataFrame | list[dict[str, Any]], params: dict[str, Any] | None = None) -> pd.DataFrame:
        import pandas as pd

        from dvfs_mlops.model.governor import policy_tree

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        table = (params or {}).get("frequencies") or None
        objective = (params or {}).get("objective") or None
        return pd.DataFrame(policy_tree.decide_rows(self.policy, frame.to_dict(orient="records"), table, objective))


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a governor decided for a workload: the GPU clock and, from a governor of configurations, the CPU and memory
    clocks with it (None from a GPU-only governor: they are left as the device has them).

    Attributes:
        freq_mhz: the GPU clock (MHz), snapped to the board's table.
        path: the decision path ("num_layers=12 > 7 -> 816 MHz"), or "refine" where no governor decided.
        cpu_mhz: the CPU clock (MHz), snapped to the table the caller gave; None: not decided.
        emc_mhz: the memory (EMC) clock (MHz), likewise.
    """

    freq_mhz: float
    path: str
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    def relabelled(self) -> Choice:
        """The choice with its path's tail (after the last " -> ") naming the clocks it holds now (snapped to a table,
        or left alone where the device cannot pin them); a path without a clock at its tail ("refine") as it is."""
        from dvfs_mlops.clocks import Setting

        head, sep, tail = self.path.rpartition(" -> ")
        if not tail.endswith(" MHz"):
            return self
        return dataclasses.replace(self, path=head + sep + Setting(self.freq_mhz, self.cpu_mhz, self.emc_mhz).label())


def _clock(out: pd.DataFrame, column: str, table: Sequence[float] | None) -> float | None:
    """A decided CPU or memory clock from the model's output (absent or null: None), snapped to `table` where given."""
    from dvfs_mlops.model.governor.policy_tree import snap

    if column not in out:
        return None
    value = out[column].iloc[0]
    if value is None or math.isnan(float(value)):  # None, or NaN where pandas made the column float
        return None
    return snap(float(value), table)


@dataclasses.dataclass(frozen=True)
class Governor:
    """A loaded governor: `ref` says which, `model` decides (a `PolicyModel`, or the MLflow pyfunc)."""

    ref: GovernorRef
    model: Any

    def decide(self, features: WorkloadFeatures | dict[str, Any], frequencies: Sequence[float],
               objective: str | None = None, *, cpu_frequencies: Sequence[float] | None = None,
               emc_frequencies: Sequence[float] | None = None) -> Choice:
        """The `Choice` for a workload on a clock table: the GPU clock, and a governor of configurations' CPU and memory
        clocks (each snapped to its table where one is given: a governor trained on other tables picks the nearest).

        Args:
            features: the workload's features (`gpu_util_pct` measured at maxn).
            frequencies: the board's clock table; the choice is snapped to it.
            objective: energy, edp or max-slowdown:X for a curve governor or one of configurations (None: the one it
                was trained for).
            cpu_frequencies: the device's CPU clocks (None: a decided CPU clock is given as the governor's).
            emc_frequencies: the device's memory clocks, likewise.

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
        return Choice(float(out["freq_mhz"].iloc[0]), path, _clock(out, "cpu_mhz", cpu_frequencies),
                      _clock(out, "emc_mhz", emc_frequencies)).relabelled()  # the path names the snapped clocks

    def check_board(self, board: Board, strict: bool, say: Callable[[str], None]) -> None:
        """A governor trained for another device profile: an error with `strict`, else a warning where that profile is
        of another board family (a board and its twin, e.g. jetson-agx-orin-64gb and sim-orin, are one family: logged).

        Raises:
            DvfsError: with `strict`, when the version was trained for another profile.
        """
        trained_for = self.ref.device_profile
        if trained_for and trained_for != board.profile:
            msg = f"governor {self.ref.uri} was trained for device profile {trained_for!r}, this device is {board.profile!r}"
            if strict:
                raise DvfsError(msg + " (--strict); retrain on this device or drop --strict")
            if board_family(trained_for) == board.family:
                log.info("%s, of the same family (%s)", msg, board.family)
            else:
                say(f"warning: {msg}; its clocks are snapped to this device's table")


@dataclasses.dataclass(frozen=True)
class BoardGovernor:
    """What decides on a board: its family's production governor, another family's (`allow_other_board`), or none.

    With none, the job refines from the curve model (`job/refine.py`): it starts at the middle of the board's table
    (`refine_start_mhz`) and the probes, not a governor, pick the clock.

    Attributes:
        governor: the loaded governor; None where this family has none.
        family: the board's family.
        note: the one line a launcher says ('' where the board's own governor decides).
        other_board: the governor is of another family, applied on purpose (--allow-other-board).
    """

    governor: Governor | None
    family: str
    note: str = ""
    other_board: bool = False

    @property
    def ref(self) -> GovernorRef:
        """The governor's reference; an empty one (uri '') where none decides."""
        return self.governor.ref if self.governor is not None else GovernorRef("")

    def decide(self, features: WorkloadFeatures | dict[str, Any], board: Board, objective: str | None = None, *,
               cpu_frequencies: Sequence[float] | None = None, emc_frequencies: Sequence[float] | None = None) -> Choice:
        """The governor's `Choice` (`Governor.decide`, on the board's clock table and the CPU and memory tables given),
        or refine's start and the path `refine`.

        Raises:
            DvfsError: the governor could not decide.
        """
        if self.governor is None:
            return Choice(refine_start_mhz(board), "refine")
        return self.governor.decide(features, board.frequencies_mhz, objective, cpu_frequencies=cpu_frequencies,
                                    emc_frequencies=emc_frequencies)


def refine_start_mhz(board: Board) -> float:
    """Where refine starts without a governor: the middle clock of the board's table (the probes go either way)."""
    table = sorted(float(f) for f in board.frequencies_mhz)
    return table[len(table) // 2]


def governor_for_board(board: Board, uri: str | None = None, *, allow_other_board: bool = False, strict: bool = False,
                       say: Callable[[str], None] = log.info) -> BoardGovernor:
    """What decides on `board`: the one call `dvfs-mlops finetune` and `DvfsCallback` make before deciding.

    The family's production governor (or `uri`); with none, a `BoardGovernor` without one whose note says so (the
    caller refines from the curve model: `BoardGovernor.decide`, `launch.Decision.refine_budget`); another family's only with
    `allow_other_board`, said as a warning. A version of this family trained on another profile of it is said too
    (`Governor.check_board`).

    Args:
        board: the board.
        uri: an explicit governor (None: the family's production).
        allow_other_board: accept a governor of another family.
        strict: refuse a version trained on another device profile (`check_board`).
        say: where the warnings go (the no-governor note is the caller's to say: `note`).

    Returns:
        The `BoardGovernor`.

    Raises:
        OtherBoardGovernor: `uri` names another family's version and `allow_other_board` is not given.
        DvfsError: the store is unreachable, `uri` names nothing, nothing is registered at all, or as `check_board`.
    """
    try:
        governor = _for_board(board, uri, allow_other_board, direct=True)  # as load_governor(uri, board=board, ...)
    except NoGovernorForBoard as e:
        note = (f"no production governor for {e.family} ({e.found}); refining from the curve model; `dvfs-mlops calibrate` "
                "makes one, --allow-other-board uses another board's")
        return BoardGovernor(None, board.family, note)
    family = governor.ref.family
    if family is not None and family != board.family:
        say(f"warning: governor {governor.ref.label} is of {family}, this board is {board.family} (--allow-other-board); "
            "its clocks are snapped to this board's table")
        return BoardGovernor(governor, board.family, other_board=True)
    governor.check_board(board, strict, say)
    return BoardGovernor(governor, board.family)


def input_frame(model: Any, rows: list[dict[str, Any]]) -> pd.DataFrame:
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


def load_governor(uri: str | None = None, *, direct: bool = True, board: Board | None = None,
                  allow_other_board: bool = False) -> Governor:
    """The governor at `uri` (default: the production alias; with `board`, its family's), the fast way where it can be.

    Args:
        uri: a `models:/NAME@ALIAS` or `models:/NAME/VERSION` URI, or any URI mlflow.pyfunc loads.
        direct: read a version of our own pyfunc's policy.json directly (the fast path); False: always mlflow.pyfunc.
        board: the board it will decide for: the default is then its family's production version, and a registered
            version of another family is refused unless `allow_other_board`.
        allow_other_board: accept a governor of another board family (with no `uri` and none of this family: the
            production governor of the family trained on the most workloads).

    Returns:
        The `Governor`.

    Raises:
        NoGovernorForBoard: with `board` and no `uri`, this family has no production version (and no other was allowed).
        OtherBoardGovernor: the version is of another family and `allow_other_board` is not given.
        DvfsError: the tracking store is unreachable, no version has the alias or number, or the model cannot load.
    """
    if board is not None:
        return _for_board(board, uri, allow_other_board, direct)
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


def _load(target: str, direct: bool) -> Governor:
    """`load_governor(target)` through this module's name (a caller may stand in for it), `direct=False` passed on."""
    return load_governor(target) if direct else load_governor(target, direct=False)


def _for_board(board: Board, uri: str | None, allow_other_board: bool, direct: bool) -> Governor:
    """`load_governor` with a board: the family's production (migrating an old store once where its alias is missing),
    or the explicit `uri`; either checked against the board's family."""
    from dvfs_mlops.mlops.registry import load_config

    cfg = load_config()
    target = uri or cfg.production_uri(board.family)
    try:
        governor = _load(target, direct)
    except NoAliasError:
        if uri:
            raise
        governor = _after_migration(cfg, board, target, allow_other_board, direct)
    family = governor.ref.family
    if family is None or family == board.family:
        return governor
    if not allow_other_board:
        if uri:
            raise OtherBoardGovernor(f"governor {target} is {governor.ref.label.split(' (')[0]} of {family}, this board is "
                                     f"{board.family}; pass --allow-other-board to use it anyway (its clocks are snapped to "
                                     "this board's table)")
        raise NoGovernorForBoard(board.family, f"{cfg.production} is v{governor.ref.version} of {family}")
    return governor


def _after_migration(cfg: RegistryConfig, board: Board, target: str, allow_other_board: bool, direct: bool) -> Governor:
    """The family's production after `registry.ensure_families` (a store from before families has only `production`);
    else, where allowed, another family's; else `NoGovernorForBoard`."""
    from dvfs_mlops.mlops.registry import ensure_families, family_productions, richest_production

    c = tracking.check_reachable()
    if ensure_families(c, cfg):
        try:
            return _load(target, direct)
        except NoAliasError:
            pass
    productions = family_productions(c, cfg)
    if not productions:
        versions = c.search_model_versions(f"name='{cfg.name}'") if _model_exists(c, cfg.name) else []
        if not versions:  # nothing registered at all: the store is not set up (the message says how)
            _load(cfg.production_uri(None), direct)
    other = richest_production(c, cfg, board.family) if allow_other_board else None
    if other is not None:
        return _load(cfg.production_uri(other[0]), direct)
    raise NoGovernorForBoard(board.family, _registered(productions))


def _model_exists(c: MlflowClient, name: str) -> bool:
    try:
        c.get_registered_model(name)
    except Exception:  # noqa: BLE001
        return False
    return True


def _registered(productions: dict[str, Any]) -> str:
    """`registered: jetson-agx-orin-64gb v3, ...` (each family's production), or `none registered`."""
    if not productions:
        return "no production governor of any board"
    return "registered: " + ", ".join(f"{family} v{mv.version}" for family, mv in sorted(productions.items()))


def _reference(c: MlflowClient, target: str) -> GovernorRef:
    """Which version `target` names (its alias or number checked), or a bare reference for another URI form."""
    from dvfs_mlops.mlops.registry import alias_version, get_version

    m = _MODELS_URI.fullmatch(target)
    if m is None:
        return GovernorRef(target)
    name, alias, number = m.groups()
    if alias:
        mv = alias_version(c, name, alias)
        if mv is None:
            raise NoAliasError(f"no {name} version has alias '{alias}'; register one with `dvfs-mlops train` (or `dvfs-mlops "
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


def _shipped_policy(c: MlflowClient, ref: GovernorRef) -> dict[str, Any] | None:
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
