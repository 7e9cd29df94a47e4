"""The governor in the MLflow Model Registry: register, list, show, promote (gated), rollback, resolve, per board family.

One registered model (`dvfs-governor`) holds the governors of every board family; each version carries its family
(tag `dvfs.board_family`, `hw.board.board_family`). Aliases are the source of truth: `production-<family>` and
`previous-<family>` per family; for the legacy family (the AGX Orin 64 GB, `aliases.legacy_family` of governor.yaml)
`production` and `previous` move with them, so `models:/dvfs-governor@production` means what it always meant. The
legacy stage "Production" is set for that family too, so older MLflow UIs show it. A store made before families
existed is migrated on first use (`ensure_families`): each version gets its family from its tags, and the legacy
aliases get their family twins. Gates come from governor.yaml of the package's registry data (the top-level
`registry/`, or $DVFS_REGISTRY_DIR); a missing file is an error. A gate applies to one kind of version (`for:`
trained, calibrated; default trained) and compares with the candidate family's production.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import lifecycle, schema, tracking

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)



# The board family a version belongs to when its tags say nothing: before families existed every version was the AGX
# Orin 64 GB's (the published tree's, `baselines/paper-mlg.json` device_profile).
LEGACY_FAMILY = "jetson-agx-orin-64gb"
MIGRATED_TAG = "dvfs.families"  # on the registered model: "1" once every version carries its family (ensure_families)
TRAINED, CALIBRATED, BASELINE = "trained", "calibrated", "baseline"  # what kind of version a gate applies to


@dataclasses.dataclass(frozen=True)
class RegistryConfig:
    """governor.yaml: the registered model's name, its aliases and the promotion gates.

    Attributes:
        name: the registered model (dvfs-governor).
        production: the legacy production alias (`production`): the legacy family's production.
        previous: the legacy previous alias.
        gates: the promotion gates, in order.
        legacy_family: the family `production` and `previous` belong to.
    """

    name: str
    production: str
    previous: str
    gates: list[dict[str, Any]]
    legacy_family: str = LEGACY_FAMILY

    def production_alias(self, family: str) -> str:
        """`production-<family>`: the family's production version."""
        return f"{self.production}-{family}"

    def previous_alias(self, family: str) -> str:
        """`previous-<family>`: the family's production before its last promotion (rollback target)."""
        return f"{self.previous}-{family}"

    def production_uri(self, family: str | None = None) -> str:
        """`models:/<name>@production` for the legacy family (or no family), else `models:/<name>@production-<family>`."""
        alias = self.production if family in (None, self.legacy_family) else self.production_alias(family)
        return f"models:/{self.name}@{alias}"


def load_config(path: str | Path | None = None) -> RegistryConfig:
    """governor.yaml of the registry data (or PATH). A missing or malformed file is an error, never "no gates"."""
    import yaml

    from dvfs_mlops.settings import registry_file

    p = Path(path) if path else registry_file("governor.yaml", what="registry config (promotion gates)")
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise DvfsError(f"registry config (promotion gates) {p} not found") from None
    except (OSError, yaml.YAMLError) as e:
        raise DvfsError(f"cannot read registry config {p}: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gates"), list):
        raise DvfsError(f"registry config {p} has no 'gates:' list (write 'gates: []' to promote without gates)")
    bad = [i for i, g in enumerate(data["gates"]) if not isinstance(g, dict) or "metric" not in g]
    if bad:
        raise DvfsError(f"registry config {p}: gate #{bad[0] + 1} has no 'metric:'")
    aliases = data.get("aliases") or {}
    kinds = [g.get("for", TRAINED) for g in data["gates"]]
    wrong = [k for k in kinds if k not in (TRAINED, CALIBRATED)]
    if wrong:
        raise DvfsError(f"registry config {p}: a gate's 'for:' is {wrong[0]!r}; use {TRAINED} or {CALIBRATED}")
    return RegistryConfig(data.get("name", "dvfs-governor"), aliases.get("production", "production"),
                          aliases.get("previous", "previous"), list(data["gates"]), aliases.get("legacy_family", LEGACY_FAMILY))


def version_family(tags: Mapping[str, str], default: str = LEGACY_FAMILY) -> str:
    """The board family a version belongs to: its `dvfs.board_family` tag, else the family of its `device_profile`
    tag (`hw.board.board_family`; a fleet's "a+b" profiles: their one family), else `default` (a version from
    before either tag: the AGX Orin 64 GB's)."""
    from dvfs_mlops.hw.board import board_family

    family = tags.get(schema.TAG_BOARD_FAMILY)
    if family:
        return family
    profiles = [p for p in str(tags.get(schema.TAG_VERSION_PROFILE) or "").split("+") if p]
    families = sorted({board_family(p) for p in profiles})
    return "+".join(families) if families else default


def version_knobs(tags: Mapping[str, str]) -> str:
    """The clocks a version decides: "gpu,cpu,emc" ... for a governor of configurations (its tag `knobs`), else "gpu"
    (a GPU-only governor: a version without the tag)."""
    return str(tags.get(schema.TAG_VERSION_KNOBS) or "gpu")


def version_kind(tags: Mapping[str, str]) -> str:
    """baseline (the published tree), calibrated (`dvfs-mlops calibrate`) or trained (`dvfs-mlops train`)."""
    if tags.get(schema.TAG_BASELINE) == "true":
        return BASELINE
    return CALIBRATED if tags.get(schema.TAG_CALIBRATED_FROM) else TRAINED


def _client() -> MlflowClient:
    return tracking.check_reachable()


def get_version(c: MlflowClient, name: str, version: str | int) -> ModelVersion:
    """A version of the registered model by number, "latest", or an alias (`production`, `production-<family>`, ...).

    Raises:
        DvfsError: no such version or alias (the message lists the ones there are).
    """
    if str(version) == "latest":
        versions = c.search_model_versions(f"name='{name}'")
        if not versions:
            raise DvfsError(f"{name} has no versions yet; run dvfs-mlops train or dvfs-mlops registry bootstrap")
        version = max(int(v.version) for v in versions)
    elif not str(version).isdigit():
        mv = alias_version(c, name, str(version))
        if mv is None:
            raise DvfsError(f"{name} has no version with alias {version!r}; aliases: {_aliases_shown(c, name)}")
        return mv
    try:
        return c.get_model_version(name, str(version))
    except Exception:  # noqa: BLE001
        numbers = [str(v.version) for v in c.search_model_versions(f"name='{name}'")]
        shown = ", ".join(sorted(numbers, key=int)) or "none (run dvfs-mlops train or registry bootstrap)"
        raise DvfsError(f"{name} has no version {version}; versions: {shown}") from None


def _aliases_shown(c: MlflowClient, name: str) -> str:
    try:
        aliases = dict(c.get_registered_model(name).aliases or {})
    except Exception:  # noqa: BLE001 - no such model
        aliases = {}
    return ", ".join(f"{a} (v{v})" for a, v in sorted(aliases.items())) or "none (dvfs-mlops registry promote VERSION sets one)"


def alias_version(c: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    """The version that holds `alias`, None when none does (or the model does not exist)."""
    try:
        return c.get_model_version_by_alias(name, alias)
    except Exception:  # noqa: BLE001 - no such alias (or model)
        return None


def version_metrics(c: MlflowClient, mv: ModelVersion) -> dict[str, float]:
    if not mv.run_id:
        return {}
    try:
        return dict(c.get_run(mv.run_id).data.metrics)
    except Exception:  # noqa: BLE001
        return {}


def describe(c: MlflowClient, mv: ModelVersion) -> dict[str, Any]:
    m = version_metrics(c, mv)
    return {"version": int(mv.version), "aliases": list(mv.aliases), "run_id": mv.run_id, "tags": dict(mv.tags),
            "family": version_family(mv.tags),
            "metrics": {k: m[k] for k in sorted(m) if any(w in k for w in ("loocv", "outer", "inner", "calibration"))
                        or k in ("n_workloads", "n_features_used", "features_matter", "tree_depth", "n_outer_groups")},
            "created": mv.creation_timestamp}


def ensure_families(c: MlflowClient, cfg: RegistryConfig, say: Callable[[str], None] = log.info) -> int:
    """The migration of a store made before board families: every version without a `dvfs.board_family` tag gets the
    one its tags imply (`version_family`), and the legacy `production`/`previous` aliases get their family twins
    (`production-<family>` of the version they hold). Done once per registered model (its tag `dvfs.families`); a
    model that does not exist yet needs none.

    Returns:
        How many versions were tagged.
    """
    try:
        model = c.get_registered_model(cfg.name)
    except Exception:  # noqa: BLE001 - no such model: nothing registered, nothing to migrate
        return 0
    if (model.tags or {}).get(MIGRATED_TAG) == "1":
        return 0
    tagged = 0
    for v in c.search_model_versions(f"name='{cfg.name}'"):
        if not (v.tags or {}).get(schema.TAG_BOARD_FAMILY):
            c.set_model_version_tag(cfg.name, str(v.version), schema.TAG_BOARD_FAMILY, version_family(v.tags or {}, cfg.legacy_family))
            tagged += 1
    for legacy, of_family in ((cfg.production, cfg.production_alias), (cfg.previous, cfg.previous_alias)):
        mv = alias_version(c, cfg.name, legacy)
        if mv is not None:
            family = version_family(mv.tags, cfg.legacy_family)
            if alias_version(c, cfg.name, of_family(family)) is None:
                c.set_registered_model_alias(cfg.name, of_family(family), mv.version)
    c.set_registered_model_tag(cfg.name, MIGRATED_TAG, "1")
    if tagged:
        say(f"{cfg.name}: {tagged} version(s) from before board families now carry their family (tag {schema.TAG_BOARD_FAMILY})")
    return tagged


def family_productions(c: MlflowClient, cfg: RegistryConfig) -> dict[str, ModelVersion]:
    """Every family's production version: {family: ModelVersion}, from the `production-<family>` aliases."""
    try:
        aliases = dict(c.get_registered_model(cfg.name).aliases or {})
    except Exception:  # noqa: BLE001 - no such model
        return {}
    prefix = cfg.production_alias("")
    return {alias[len(prefix):]: c.get_model_version(cfg.name, str(v)) for alias, v in sorted(aliases.items())
            if alias.startswith(prefix) and len(alias) > len(prefix)}


def workloads_of(mv: ModelVersion) -> int:
    """How many workloads a version was trained on (tag n_workloads; the published tree's "published", a calibrated
    version's source's count): what `calibrate` and --allow-other-board rank other families' governors by."""
    text = str((mv.tags or {}).get(schema.TAG_N_WORKLOADS) or "")
    return int(text) if text.isdigit() else 0


def richest_production(c: MlflowClient, cfg: RegistryConfig, besides: str, knobs: str | None = None) -> tuple[str, ModelVersion] | None:
    """(family, version): the production governor of a family other than `besides` trained on the most workloads (a
    trained version before a calibrated one at the same count, then the newest); None where there is none. What
    `calibrate` moves to a board by default (`knobs="gpu"`: only a GPU-only governor can be calibrated), and what
    --allow-other-board lets decide (`knobs` None: any)."""
    others = [(f, mv) for f, mv in family_productions(c, cfg).items()
              if f != besides and (knobs is None or version_knobs(mv.tags) == knobs)]
    if not others:
        return None
    return max(others, key=lambda fm: (workloads_of(fm[1]), version_kind(fm[1].tags) != CALIBRATED, int(fm[1].version)))


def list_versions(config: RegistryConfig | None = None, family: str = "") -> list[dict[str, Any]]:
    """Every version (or those of one board family), with its aliases, family, tags and held-out figures."""
    cfg = config or load_config()
    c = _client()
    ensure_families(c, cfg)
    versions = c.search_model_versions(f"name='{cfg.name}'")
    # search results carry no aliases in every store: fetch each version for them
    out = [describe(c, c.get_model_version(cfg.name, v.version)) for v in sorted(versions, key=lambda v: int(v.version))]
    return [v for v in out if not family or v["family"] == family]


def show_version(version: str | int, config: RegistryConfig | None = None) -> dict[str, Any]:
    """One version's tags, aliases, family and metrics (`describe`), by number, "latest" or alias.

    Raises:
        DvfsError: no such version or alias.
    """
    cfg = config or load_config()
    c = _client()
    ensure_families(c, cfg)
    mv = get_version(c, cfg.name, version)
    return describe(c, c.get_model_version(cfg.name, str(mv.version)))  # by number: a search result may lack aliases


@dataclasses.dataclass
class GateResult:
    name: str
    passed: bool | None  # None = not applicable
    detail: str


def check_gates(c: MlflowClient, cfg: RegistryConfig, candidate: ModelVersion) -> list[GateResult]:
    """The gates that apply to the candidate's kind (`for:`), each compared with its own family's production."""
    cand = version_metrics(c, candidate)
    kind = version_kind(candidate.tags)
    family = version_family(candidate.tags, cfg.legacy_family)
    prod = alias_version(c, cfg.name, cfg.production_alias(family))
    prod_m = version_metrics(c, prod) if prod is not None and prod.version != candidate.version else None
    out = []
    for gate in cfg.gates:
        if gate.get("for", TRAINED) != (TRAINED if kind == BASELINE else kind):  # a baseline is shown the trained gates (n/a)
            continue
        name, metric = gate.get("name", gate.get("metric", "gate")), gate["metric"]
        value = cand.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            if kind == BASELINE:
                out.append(GateResult(name, None, f"{metric} not applicable to a baseline version"))
            else:
                out.append(GateResult(name, False, f"version {candidate.version} has no {metric}"))
            continue
        out.append(_gate(gate, name, metric, value, cand, candidate, prod, prod_m, family))
    return out


def _gate(gate: dict[str, Any], name: str, metric: str, value: float, cand: dict[str, float], candidate: ModelVersion,
          prod: Any,
          prod_m: dict[str, float] | None, family: str) -> GateResult:
    """One gate's verdict on a candidate that has the gate's metric."""
    when = gate.get("when")
    if isinstance(when, dict) and "metric" in when:
        cond = cand.get(when["metric"])
        if cond is None or not cond >= float(when.get("at_least", 1)):
            return GateResult(name, None, f"not applicable: {when['metric']} is {cond if cond is not None else 'absent'}")
    if "production_not" in gate:  # the family's production may not be of this kind (a calibration is a stand-in)
        kind = version_kind(prod.tags) if prod is not None and prod.version != candidate.version else None
        if kind is None:
            return GateResult(name, None, f"no production version of {family} yet")
        return GateResult(name, kind != gate["production_not"], f"{family}'s production v{prod.version} is {kind}")
    if gate.get("compare_to") == "production":
        if prod_m is None or metric not in prod_m:
            return GateResult(name, None, f"no production version of {family} to compare with")
        knobs, prod_knobs = version_knobs(candidate.tags), version_knobs(prod.tags)
        if knobs != prod_knobs:  # a governor of configurations' regret is against the joint oracle, a GPU-only one's not
            return GateResult(name, None, f"not applicable: this version decides {knobs}, {family}'s production v{prod.version} "
                                          f"{prod_knobs} (regrets against different oracles; `dvfs-mlops evaluate` compares them)")
        limit = prod_m[metric] + float(gate.get("tolerance", 0.0))
        return GateResult(name, value <= limit + 1e-12,
                          f"{metric} {value:.4f} vs {family}'s production v{prod.version} {prod_m[metric]:.4f} (+{gate.get('tolerance', 0.0)})")
    for key, strict in (("at_most_metric", False), ("below_metric", True)):  # below: strict, a tie fails
        if key in gate:
            other = cand.get(gate[key])
            if other is None:
                return GateResult(name, False, f"version {candidate.version} has no {gate[key]}")
            if strict:
                return GateResult(name, value < other, f"{metric} {value:.4f} < {gate[key]} {other:.4f} (strictly)")
            tolerance = float(gate.get("tolerance", 0.0))
            return GateResult(name, value <= other + tolerance + 1e-12,
                              f"{metric} {value:.4f} <= {gate[key]} {other:.4f}" + (f" (+{tolerance:g})" if tolerance else ""))
    if "at_least" in gate:
        return GateResult(name, value >= float(gate["at_least"]), f"{metric} {value:g} >= {gate['at_least']}")
    if "at_most" in gate:
        return GateResult(name, value <= float(gate["at_most"]), f"{metric} {value:g} <= {gate['at_most']}")
    return GateResult(name, None, "no comparison given (compare_to, at_most, at_least, at_most_metric, below_metric)")


def _set_production(c: MlflowClient, cfg: RegistryConfig, family: str, new: ModelVersion, old: ModelVersion | None) -> None:
    """`production-<family>` -> new, `previous-<family>` -> old; the legacy family's `production`/`previous` (and the
    deprecated stage, for older UIs) with them."""
    pairs = [(cfg.production_alias(family), cfg.previous_alias(family))]
    if family == cfg.legacy_family:
        pairs.append((cfg.production, cfg.previous))
    for production, previous in pairs:
        c.set_registered_model_alias(cfg.name, production, new.version)
        if old is not None and old.version != new.version:
            c.set_registered_model_alias(cfg.name, previous, old.version)
    if family != cfg.legacy_family:
        return  # the stage is one per model: it stays the legacy family's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stages are deprecated; set for older UIs only
        with contextlib.suppress(Exception):  # a store without stages
            c.transition_model_version_stage(cfg.name, new.version, "Production", archive_existing_versions=True)


def promote(version: str | int, force: bool = False, config: RegistryConfig | None = None,
            say: Callable[[str], None] = log.info, family: str = "") -> list[GateResult]:
    """Gate, then move the version's family's production alias to VERSION and the old one to previous.

    Args:
        version: a version number or "latest".
        force: promote even if a gate fails.
        config: the registry config (default governor.yaml).
        say: where the gates' results and the change go.
        family: '' the version's own; else the family it must belong to.

    Returns:
        The gates' results.

    Raises:
        DvfsError: no such version, a version of another family than `family`, or a failed gate without `force`.
    """
    cfg = config or load_config()
    c = _client()
    ensure_families(c, cfg, say)
    cand = get_version(c, cfg.name, version)
    own = version_family(cand.tags, cfg.legacy_family)
    if family and family != own:
        raise DvfsError(f"{cfg.name} v{cand.version} is a governor of {own}, not {family}; promote one of {family}'s "
                        f"versions (dvfs-mlops registry list --family {family})")
    results = check_gates(c, cfg, cand)
    for r in results:
        mark = {True: "pass", False: "FAIL", None: "n/a "}[r.passed]
        say(f"  gate {mark} {r.name}: {r.detail}")
    failed = [r for r in results if r.passed is False]
    if failed and not force:
        raise DvfsError(f"version {version} failed gate(s) {', '.join(r.name for r in failed)} "
                        f"({'; '.join(r.detail for r in failed)}); fix it or pass --force")
    production = cfg.production_alias(own)
    old = alias_version(c, cfg.name, production)
    if old is not None and old.version == cand.version:
        say(f"{cfg.name} v{cand.version} is already {production}; nothing changed")
        return results
    _set_production(c, cfg, own, cand, old)
    forced = " (gates overridden by --force)" if failed else ""
    say(_moved(cfg, own, cand, old) + forced)
    return results


def _moved(cfg: RegistryConfig, family: str, new: ModelVersion, old: ModelVersion | None) -> str:
    """How an alias change is said: `production -> vN, previous -> vM` for the legacy family (its family twins named
    after it), `production-<family> -> vN, previous-<family> -> vM` for another."""
    legacy = family == cfg.legacy_family
    production, previous = (cfg.production, cfg.previous) if legacy else (cfg.production_alias(family), cfg.previous_alias(family))
    said = f"{cfg.name}: {production} -> v{new.version}" + (f", {previous} -> v{old.version}" if old is not None else "")
    return said + (f" ({cfg.production_alias(family)} and {cfg.previous_alias(family)} with them)" if legacy else "")


def rollback(config: RegistryConfig | None = None, say: Callable[[str], None] = log.info, family: str = "") -> None:
    """Swap a family's production and previous back (default: the legacy family's, `production`).

    Raises:
        DvfsError: the family has no previous version.
    """
    cfg = config or load_config()
    c = _client()
    ensure_families(c, cfg, say)
    family = family or cfg.legacy_family
    prev = alias_version(c, cfg.name, cfg.previous_alias(family))
    prod = alias_version(c, cfg.name, cfg.production_alias(family))
    if prev is None:
        raise DvfsError(f"{cfg.name} has no '{cfg.previous_alias(family)}' version to roll back to (promote one of {family} first)")
    _set_production(c, cfg, family, prev, prod)
    say(_moved(cfg, family, prev, prod))


def bootstrap(config: RegistryConfig | None = None, say: Callable[[str], None] = log.info) -> int:
    """Register the published tree (registry data: baselines/paper-mlg.json) as a version (its run in dvfs-governor,
    `lifecycle.owned_run`)."""
    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.model.governor.policies import paper_tree

    cfg = config or load_config()
    c = _client()
    policy = paper_tree().policy
    tags = {schema.TAG_BASELINE: "true", schema.TAG_OBJECTIVE: policy.get("objective", "energy"),
            schema.TAG_VERSION_PROFILE: policy.get("device_profile", ""), schema.TAG_VERSION_SWEEP: "", schema.TAG_N_WORKLOADS: "published",
            schema.TAG_SOURCE: "paper-mlg"}
    tags[schema.TAG_BOARD_FAMILY] = version_family(tags, cfg.legacy_family)
    with lifecycle.owned_run(schema.GOVERNOR_EXPERIMENT, name="bootstrap paper-mlg", tags=tags, client=c, adopt=False, fluent=True) as run:
        info = log_governor(policy, registered_name=cfg.name, version_tags=tags)
    version = int(info.registered_model_version)
    say(f"registered the published tree as {cfg.name} v{version} for {tags[schema.TAG_BOARD_FAMILY]} (run {run.run_id}); "
        f"promote it with: dvfs-mlops registry promote {version}")
    return version
