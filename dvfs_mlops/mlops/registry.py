"""The governor in the MLflow Model Registry: register, list, show, promote (gated), rollback, resolve.

Aliases are the source of truth (`production`, `previous`); the legacy stage "Production" is set
too so older MLflow UIs show it. Gates come from governor.yaml of the package's registry data
(the top-level `registry/`, or $DVFS_REGISTRY_DIR); a missing file is an error.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops import schema, tracking

log = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class RegistryConfig:
    name: str
    production: str
    previous: str
    gates: list[dict[str, Any]]


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
    return RegistryConfig(data.get("name", "dvfs-governor"), aliases.get("production", "production"),
                          aliases.get("previous", "previous"), list(data["gates"]))


def _client() -> Any:
    return tracking.check_reachable()


def get_version(c: Any, name: str, version: str | int) -> Any:
    """A version of the registered model by number, or "latest".

    Raises:
        DvfsError: no such version (the message lists the ones there are).
    """
    if str(version) == "latest":
        versions = c.search_model_versions(f"name='{name}'")
        if not versions:
            raise DvfsError(f"{name} has no versions yet; run dvfs-mlops train or dvfs-mlops registry bootstrap")
        version = max(int(v.version) for v in versions)
    try:
        return c.get_model_version(name, str(version))
    except Exception:  # noqa: BLE001
        versions = [str(v.version) for v in c.search_model_versions(f"name='{name}'")]
        shown = ", ".join(sorted(versions, key=int)) or "none (run dvfs-mlops train or registry bootstrap)"
        raise DvfsError(f"{name} has no version {version}; versions: {shown}") from None


def alias_version(c: Any, name: str, alias: str) -> Any | None:
    """The version that holds `alias`, None when none does (or the model does not exist)."""
    try:
        return c.get_model_version_by_alias(name, alias)
    except Exception:  # noqa: BLE001 - no such alias (or model)
        return None


def version_metrics(c: Any, mv: Any) -> dict[str, float]:
    if not mv.run_id:
        return {}
    try:
        return dict(c.get_run(mv.run_id).data.metrics)
    except Exception:  # noqa: BLE001
        return {}


def describe(c: Any, mv: Any) -> dict[str, Any]:
    m = version_metrics(c, mv)
    return {"version": int(mv.version), "aliases": list(mv.aliases), "run_id": mv.run_id, "tags": dict(mv.tags),
            "metrics": {k: m[k] for k in sorted(m) if any(w in k for w in ("loocv", "outer", "inner"))
                        or k in ("n_workloads", "n_features_used", "features_matter", "tree_depth", "n_outer_groups")},
            "created": mv.creation_timestamp}


def list_versions(config: RegistryConfig | None = None) -> list[dict[str, Any]]:
    cfg = config or load_config()
    c = _client()
    versions = c.search_model_versions(f"name='{cfg.name}'")
    # search results carry no aliases in every store: fetch each version for them
    return [describe(c, c.get_model_version(cfg.name, v.version)) for v in sorted(versions, key=lambda v: int(v.version))]


def show_version(version: str | int, config: RegistryConfig | None = None) -> dict[str, Any]:
    cfg = config or load_config()
    c = _client()
    return describe(c, get_version(c, cfg.name, version))


@dataclasses.dataclass
class GateResult:
    name: str
    passed: bool | None  # None = not applicable
    detail: str


def check_gates(c: Any, cfg: RegistryConfig, candidate: Any) -> list[GateResult]:
    cand = version_metrics(c, candidate)
    baseline = candidate.tags.get(schema.TAG_BASELINE) == "true"
    prod = alias_version(c, cfg.name, cfg.production)
    prod_m = version_metrics(c, prod) if prod is not None and prod.version != candidate.version else None
    out = []
    for gate in cfg.gates:
        name, metric = gate.get("name", gate.get("metric", "gate")), gate["metric"]
        value = cand.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            if baseline:
                out.append(GateResult(name, None, f"{metric} not applicable to a baseline version"))
            else:
                out.append(GateResult(name, False, f"version {candidate.version} has no {metric}"))
            continue
        when = gate.get("when")
        if isinstance(when, dict) and "metric" in when:
            cond = cand.get(when["metric"])
            if cond is None or not cond >= float(when.get("at_least", 1)):
                out.append(GateResult(name, None, f"not applicable: {when['metric']} is {cond if cond is not None else 'absent'}"))
                continue
        if gate.get("compare_to") == "production":
            if prod_m is None or metric not in prod_m:
                out.append(GateResult(name, None, "no production version to compare with"))
                continue
            limit = prod_m[metric] + float(gate.get("tolerance", 0.0))
            out.append(GateResult(name, value <= limit + 1e-12,
                                  f"{metric} {value:.4f} vs production v{prod.version} {prod_m[metric]:.4f} (+{gate.get('tolerance', 0.0)})"))
        elif "at_most_metric" in gate:
            other = cand.get(gate["at_most_metric"])
            if other is None:
                out.append(GateResult(name, False, f"version {candidate.version} has no {gate['at_most_metric']}"))
            else:
                out.append(GateResult(name, value <= other + 1e-12, f"{metric} {value:.4f} <= {gate['at_most_metric']} {other:.4f}"))
        elif "below_metric" in gate:  # strict: a tie fails
            other = cand.get(gate["below_metric"])
            if other is None:
                out.append(GateResult(name, False, f"version {candidate.version} has no {gate['below_metric']}"))
            else:
                out.append(GateResult(name, value < other, f"{metric} {value:.4f} < {gate['below_metric']} {other:.4f} (strictly)"))
        elif "at_least" in gate:
            out.append(GateResult(name, value >= float(gate["at_least"]), f"{metric} {value:g} >= {gate['at_least']}"))
        elif "at_most" in gate:
            out.append(GateResult(name, value <= float(gate["at_most"]), f"{metric} {value:g} <= {gate['at_most']}"))
    return out


def _set_production(c: Any, cfg: RegistryConfig, new: Any, old: Any | None) -> None:
    c.set_registered_model_alias(cfg.name, cfg.production, new.version)
    if old is not None and old.version != new.version:
        c.set_registered_model_alias(cfg.name, cfg.previous, old.version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stages are deprecated; set for older UIs only
        with contextlib.suppress(Exception):  # a store without stages
            c.transition_model_version_stage(cfg.name, new.version, "Production", archive_existing_versions=True)


def promote(version: str | int, force: bool = False, config: RegistryConfig | None = None,
            say: Callable[[str], None] = log.info) -> list[GateResult]:
    """Gate, then move `production` to VERSION and the old production to `previous`."""
    cfg = config or load_config()
    c = _client()
    cand = get_version(c, cfg.name, version)
    results = check_gates(c, cfg, cand)
    for r in results:
        mark = {True: "pass", False: "FAIL", None: "n/a "}[r.passed]
        say(f"  gate {mark} {r.name}: {r.detail}")
    failed = [r for r in results if r.passed is False]
    if failed and not force:
        raise DvfsError(f"version {version} failed gate(s) {', '.join(r.name for r in failed)} "
                        f"({'; '.join(r.detail for r in failed)}); fix it or pass --force")
    old = alias_version(c, cfg.name, cfg.production)
    if old is not None and old.version == cand.version:
        say(f"{cfg.name} v{cand.version} is already {cfg.production}; nothing changed")
        return results
    _set_production(c, cfg, cand, old)
    forced = " (gates overridden by --force)" if failed else ""
    say(f"{cfg.name}: {cfg.production} -> v{cand.version}" + (f", {cfg.previous} -> v{old.version}" if old else "") + forced)
    return results


def rollback(config: RegistryConfig | None = None, say: Callable[[str], None] = log.info) -> None:
    cfg = config or load_config()
    c = _client()
    prev = alias_version(c, cfg.name, cfg.previous)
    prod = alias_version(c, cfg.name, cfg.production)
    if prev is None:
        raise DvfsError(f"{cfg.name} has no '{cfg.previous}' version to roll back to (promote one first)")
    _set_production(c, cfg, prev, prod)
    say(f"{cfg.name}: {cfg.production} -> v{prev.version}" + (f", {cfg.previous} -> v{prod.version}" if prod else ""))


def governor_experiment(c: Any) -> str:
    return tracking.experiment_id(c, schema.GOVERNOR_EXPERIMENT)


def bootstrap(config: RegistryConfig | None = None, say: Callable[[str], None] = log.info) -> int:
    """Register the published tree (registry data: baselines/paper-mlg.json) as a version."""
    import mlflow

    from dvfs_mlops.mlops.pyfunc import log_governor
    from dvfs_mlops.model.governor.policies import paper_tree

    cfg = config or load_config()
    c = _client()
    exp = governor_experiment(c)
    policy = paper_tree().policy
    tags = {schema.TAG_BASELINE: "true", schema.TAG_OBJECTIVE: policy.get("objective", "energy"),
            schema.TAG_VERSION_PROFILE: policy.get("device_profile", ""), schema.TAG_VERSION_SWEEP: "", schema.TAG_N_WORKLOADS: "published",
            schema.TAG_SOURCE: "paper-mlg"}
    with mlflow.start_run(experiment_id=exp, run_name="bootstrap paper-mlg") as run:
        mlflow.set_tags(tags)
        info = log_governor(policy, registered_name=cfg.name)
    version = int(info.registered_model_version)
    for k, v in tags.items():
        c.set_model_version_tag(cfg.name, str(version), k, v)
    say(f"registered the published tree as {cfg.name} v{version} (run {run.info.run_id}); "
        f"promote it with: dvfs-mlops registry promote {version}")
    return version
