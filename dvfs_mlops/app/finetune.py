"""`dvfs-mlops finetune`: resolve the production governor, decide, pin, fine-tune, log, restore."""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.clocks import MAXN, freq_label
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.placement import resolve_torch_device
from dvfs_mlops.job.finetune import FinetuneConfig, finetune, num_steps, plan_batches
from dvfs_mlops.job.workloads.tokenizer import padded_length
from dvfs_mlops.mlops import records, tracking
from dvfs_mlops.model.workload import WorkloadFeatures

FINETUNE_EXPERIMENT = "dvfs-finetune"
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Decision:
    freq_mhz: float
    path: str  # "num_layers=12 > 7, avg_seq_len=71.3 > 53 -> 816 MHz"
    features: WorkloadFeatures
    governor: dict[str, Any]  # uri, name, version, alias, tags
    expected_saving: float | None  # twin's estimate vs maxn (simulated)
    util_source: str  # how gpu_util_pct was obtained

    def to_dict(self) -> dict[str, Any]:
        return {"freq_mhz": self.freq_mhz, "path": self.path, "features": self.features.as_row(),
                "governor": {k: v for k, v in self.governor.items() if k != "tags"}, "expected_saving_vs_maxn": self.expected_saving,
                "expected_saving_simulated": True, "gpu_util_source": self.util_source}


def _twin_curve(prepared: Any, batch_size: int, steps: int, seed: int, device: Any = None, dtype: str = "float32") -> Any:
    """The twin's view of this job: per-step estimates for the median padded length of its batches (on the
    sim device's own profile when `device` is the twin, else on the default one)."""
    from dvfs_mlops.hw.sim import SimDevice

    batches = plan_batches(prepared.n_train, max(1, steps), batch_size, seed)
    lengths = sorted(padded_length([prepared.train_lengths[i] for i in b]) for b in batches)
    trace = prepared.trace_provider(batch_size, dtype)(lengths[len(lengths) // 2])
    return SimDevice(params=getattr(device, "params", None) if getattr(device, "simulated", False) else None).curve(trace)


def measure_gpu_util(device: Any, prepared: Any, cfg: FinetuneConfig, probe_steps: int, *, torch_device: str | None = None,
                     observe: bool = False) -> tuple[float, str]:
    """GPU utilisation at maxn: a short probe on the device's GPU, or (0 steps) the twin's estimate.

    The probe trains on `torch_device` (default: the backend's), under the board's default clocks;
    `observe=True` takes no lock either.
    """
    if probe_steps <= 0:
        _, maxn = _twin_curve(prepared, cfg.batch_size, num_steps(cfg, prepared.n_train), cfg.seed, device, cfg.trace_dtype)
        return 100.0 * maxn.gpu_util, "twin estimate (--probe-steps 0)"
    prepared.materialize()  # the probe trains: data, tokenizer and model config, before the session starts
    probe = dataclasses.replace(cfg, steps=probe_steps, epochs=None)
    trace_for = prepared.trace_provider(cfg.batch_size, cfg.trace_dtype) if device.simulated else None
    session = device.session(MAXN, observe=observe, **({"noise_key": "probe"} if device.simulated else {}))
    with session:
        finetune(prepared.model_config, prepared.train, prepared.dev, prepared.encoder.pad_id, probe,
                 is_regression=prepared.task.is_regression, session=session, trace_for=trace_for,
                 run_training=not device.simulated, torch_device=resolve_torch_device(device, torch_device), task_kind=prepared.task.kind)
    util = session.report().gpu_util_pct
    if util is None:
        raise DvfsError(f"the {device.name} backend could not read GPU utilisation during the probe; use --probe-steps 0 for the twin's estimate")
    return float(util), f"probe: {probe_steps} steps at maxn" + (" (SIMULATED)" if device.simulated else "")


def decide(model: Any, meta: dict[str, Any], features: WorkloadFeatures, frequencies: list[float]) -> tuple[float, str]:
    from dvfs_mlops.mlops.registry import input_frame

    row = input_frame(model, [features.as_row()])
    try:
        out = model.predict(row, params={"frequencies": [float(f) for f in frequencies]})
    except Exception as e:  # noqa: BLE001
        raise DvfsError(f"governor {meta['uri']} could not decide for these features ({str(e).splitlines()[0][:200]})") from None
    return float(out["freq_mhz"].iloc[0]), str(out["decision_path"].iloc[0]) if "decision_path" in out else f"{out['freq_mhz'].iloc[0]:g} MHz"


def check_profile(meta: dict[str, Any], device: Any, strict: bool, say: Callable[[str], None]) -> None:
    trained_for = meta.get("tags", {}).get("device_profile")
    if trained_for and trained_for != device.profile:
        msg = f"governor {meta['uri']} was trained for device profile {trained_for!r}, this device is {device.profile!r}"
        if strict:
            raise DvfsError(msg + " (--strict); retrain on this device or drop --strict")
        say(f"warning: {msg}; its clocks are snapped to this device's table")


class PolicyModel:
    """A registered governor's policy.json, deciding as its pyfunc (`governor/model_code.py`) does."""

    def __init__(self, policy: dict[str, Any]):
        self.policy = policy

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import pandas as pd

        from dvfs_mlops.model.governor import policy_tree

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        table = (params or {}).get("frequencies") or None
        objective = (params or {}).get("objective") or None
        return pd.DataFrame(policy_tree.decide_rows(self.policy, frame.to_dict(orient="records"), table, objective))


_MODELS_URI = re.compile(r"models:/([^/@]+)(?:@([^/@]+)|/([0-9]+))")


def _shipped_policy(local: Path) -> dict[str, Any] | None:
    """policy.json of a downloaded governor whose code is this package's, byte for byte; None for any other model."""
    import yaml

    from dvfs_mlops.mlops.pyfunc import CODE, TREE_CODE

    pf = (yaml.safe_load((local / "MLmodel").read_text()) or {}).get("flavors", {}).get("python_function", {})
    if pf.get("loader_module") != "mlflow.pyfunc.loaders.code_model" or not pf.get("model_code_path") or not pf.get("code"):
        return None
    shipped_code = local / Path(pf["model_code_path"]).name
    shipped_tree = local / pf["code"] / "policy_tree.py"
    if not (shipped_code.is_file() and shipped_tree.is_file()):
        return None
    if shipped_code.read_bytes() != CODE.read_bytes() or shipped_tree.read_bytes() != TREE_CODE.read_bytes():
        return None
    policy_file = local / pf.get("artifacts", {}).get("policy", {}).get("path", "")
    return json.loads(policy_file.read_text()) if policy_file.is_file() else None


def _governor_target(uri: str | None) -> str:
    from dvfs_mlops.mlops.registry import load_config

    cfg = load_config()
    return uri or f"models:/{cfg.name}@{cfg.production}"


def _resolve_direct(target: str) -> tuple[Any, dict[str, Any]] | None:
    """The governor without mlflow.pyfunc: the version's policy.json, when its code is ours; else None."""
    import mlflow

    m = _MODELS_URI.fullmatch(target)
    if m is None:
        return None
    name, alias, number = m.groups()
    c = tracking.client()
    mv = c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, number)
    meta = {"uri": target, "name": name, "version": int(mv.version), "alias": alias, "tags": dict(mv.tags)}
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=c.get_model_version_download_uri(name, mv.version), dst_path=tmp))
        policy = _shipped_policy(local)
    if policy is None:
        return None
    return PolicyModel(policy), meta


def resolve_governor(uri: str | None = None) -> tuple[Any, dict[str, Any]]:
    """(model, meta) of the governor, as `registry.resolve` gives them, decided the same way.

    A registered version of our models-from-code pyfunc whose `model_code.py` and `policy_tree.py`
    are this package's, byte for byte, decides exactly as `policy_tree` does on its policy.json: that
    file is read directly, without mlflow.pyfunc's loading machinery (environment checks, code
    import), and remembered while a SQLite store is not written (`governor_cache.py`: such a
    decision imports no MLflow at all). Anything else (another URI form, other code, any failure,
    which includes every error a user should see) goes through `registry.resolve` and mlflow.pyfunc.
    """
    from dvfs_mlops.mlops import alias_cache as governor_cache

    target = _governor_target(uri)
    store = tracking.tracking_uri()
    hit = governor_cache.lookup(store, target)
    if hit is not None:
        log.debug("governor %s v%s: remembered (the store is unchanged since it was resolved)", hit.meta["name"], hit.meta["version"])
        return PolicyModel(hit.policy), hit.meta
    stamp = governor_cache.store_stamp(store)
    tracking.check_reachable()  # an unreachable store is one clear line, whichever way the governor is loaded
    from dvfs_mlops.mlops.registry import resolve

    try:
        direct = _resolve_direct(target)
    except Exception as e:  # noqa: BLE001 - registry.resolve says what is wrong, in its words
        log.debug("governor %s: no direct policy read (%s); loading it with mlflow.pyfunc", target, e)
        direct = None
    if direct is None:
        return resolve(uri)
    log.debug("governor %s v%s: policy.json read directly (its code is this package's)", direct[1]["name"], direct[1]["version"])
    governor_cache.remember(store, target, stamp, governor_cache.CachedGovernor(direct[0].policy, direct[1]))
    return direct


def plan_decision(device: Any, prepared: Any, cfg: FinetuneConfig, governor_uri: str | None, probe_steps: int, strict: bool,
                  say: Callable[[str], None], announce_device: bool = False, *, torch_device: str | None = None,
                  observe: bool = False) -> tuple[Decision, Any]:
    from dvfs_mlops.hw import describe_device

    model, meta = resolve_governor(governor_uri)  # a missing governor is an error before the device is used
    check_profile(meta, device, strict, say)
    if announce_device:
        say(describe_device(device))
    util, source = measure_gpu_util(device, prepared, cfg, probe_steps, torch_device=torch_device, observe=observe)
    features = prepared.features.with_gpu_util(util)
    freq, path = decide(model, meta, features, device.frequencies_mhz)
    saving = None
    try:
        curve, maxn = _twin_curve(prepared, cfg.batch_size, num_steps(cfg, prepared.n_train), cfg.seed, device, cfg.trace_dtype)
        nearest = min(curve, key=lambda f: abs(f - freq))
        saving = 1.0 - curve[nearest].energy_j / maxn.energy_j
    except Exception:  # noqa: BLE001 - an estimate only; a custom config the twin can't trace just has none
        saving = None
    return Decision(freq, path, features, meta, saving, source), model


def describe_decision(d: Decision, device: Any) -> list[str]:
    g = d.governor
    who = f"{g['name']} v{g['version']}" + (f" (@{g['alias']})" if g.get("alias") else "") if g.get("name") else g["uri"]
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.features.as_row().items()]
    lines = [f"governor: {who}", "features: " + ", ".join(shown) + f"  [gpu util: {d.util_source}]", f"decision: {d.path}"]
    if d.expected_saving is not None:
        lines.append(f"expected saving vs maxn: {100 * d.expected_saving:.1f}% (twin estimate, SIMULATED)")
    return lines


def save_model_artifacts(result: Any, prepared: Any, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.model.save_pretrained(out)
    enc = prepared.encoder
    if hasattr(enc.backend, "save_pretrained"):
        enc.backend.save_pretrained(out)
    else:
        enc.backend.save(str(out / "tokenizer.json"))


def run_finetune(device: Any, prepared: Any, cfg: FinetuneConfig, *, governor_uri: str | None = None, probe_steps: int = 5,
                 dry_run: bool = False, strict: bool = False, save_model: bool = True, pretrained: str | None = None,
                 say: Callable[[str], None] = print, announce_device: bool = False, torch_device: str | None = None,
                 observe: bool = False, refine: int | None = None) -> dict[str, Any]:
    """The launcher. Returns a JSON-able summary (decision, and the run's id/metrics unless dry-run).

    `observe=True` decides and reports the clock it would pin, but fine-tunes under the clocks as
    found and meters only (no lock, no write: no root needed); the run is tagged dvfs.observe=true.
    `refine` is the probe-step budget of probe-and-refine (`refine.py`; 0 = off; None = the backend's
    default, `default_refine`): the job settles at the curve model's optimum, probes included in its totals.
    """
    where = resolve_torch_device(device, torch_device)  # CUDA missing: an error before any clock is touched
    c = None if dry_run else tracking.check_reachable()  # before any clock is touched (a dry run may need no store)
    decision, _ = plan_decision(device, prepared, cfg, governor_uri, probe_steps, strict, say, announce_device=announce_device,
                                torch_device=where, observe=observe)
    for line in describe_decision(decision, device):
        say(line)
    summary: dict[str, Any] = {"decision": decision.to_dict(), "device": device.name, "device_profile": device.profile,
                               "simulated": device.simulated, "workload": prepared.name}
    if dry_run:
        say("dry run: stopping after the decision (no clock was changed)")
        return summary
    prepared.materialize()  # data, tokenizer, encoded splits: loaded before the run is created or any clock is touched
    env_run = settings.mlflow_run_id()
    exp_id = c.get_run(env_run).info.experiment_id if env_run else tracking.experiment_id(c, FINETUNE_EXPERIMENT)
    g = decision.governor
    tags = {"governor.name": str(g.get("name") or ""), "governor.version": str(g.get("version") or ""),
            "governor.alias": str(g.get("alias") or ""), "governor.uri": g["uri"], "decision.path": decision.path,
            tracking.TAG_SIMULATED: str(device.simulated).lower(), tracking.TAG_WORKLOAD: prepared.name}
    run_id = env_run or c.create_run(exp_id, run_name=f"{prepared.name}@{decision.freq_mhz:g}", tags=tags).info.run_id
    if env_run:
        tracking.log_run_batch(c, run_id, tags=tags)
    try:
        trace_for = prepared.trace_provider(cfg.batch_size, cfg.trace_dtype) if device.simulated else None
        session = device.session(decision.freq_mhz, observe=observe, **({"noise_key": "finetune"} if device.simulated else {}))
        sim = " (SIMULATED)" if device.simulated else ""
        say(f"observing on {device.name}{sim} (clocks left as found; would pin {decision.freq_mhz:g} MHz), fine-tuning on {where} ..."
            if observe else f"pinning {decision.freq_mhz:g} MHz on {device.name}{sim}, fine-tuning on {where} ...")
        budget = default_refine(device) if refine is None else refine
        if budget and observe:
            say("refine: off under --observe (nothing is pinned, so there is no clock to move)")
            budget = 0
        refiner = None
        with session:
            if budget:
                from dvfs_mlops.job.refine import Refiner, prior_from_governor

                refiner = Refiner(session, budget, num_steps(cfg, prepared.n_train), say=say,
                                  prior=prior_from_governor(decision.governor, device.profile))
            result = finetune(prepared.model_config, prepared.train, prepared.dev, prepared.encoder.pad_id, cfg,
                              is_regression=prepared.data.task.is_regression, session=session, trace_for=trace_for,
                              pretrained=pretrained, torch_device=where, on_step=refiner.on_step if refiner else None,
                              task_kind=prepared.task.kind)
        refined = refiner.result if refiner is not None else None
        settled = refined.chosen_mhz if refined is not None else decision.freq_mhz
        report = session.report()
        metrics = records.point_metrics(report, result, None if observe else settled, session)
        f = decision.features
        params = {"model": prepared.spec.name, "model_type": f.model_type, "num_layers": f.num_layers, "hidden_size": f.hidden_size,
                  "num_params": f.num_params, "task": prepared.data.task.name, "avg_seq_len": round(f.avg_seq_len, 3),
                  "gpu_util_probe_pct": round(f.gpu_util_pct or 0.0, 3), "freq_mhz": freq_label(settled),
                  "device": device.name, "device_profile": device.profile, "batch_size": cfg.batch_size, "steps": result.steps,
                  "seed": cfg.seed, "split": prepared.data.task.split, "data_source": prepared.data.source, "precision": cfg.precision,
                  "trainable_params": f.trainable_params, **cfg.peft.params(), "torch_device": where, **records.session_params(session)}
        tracking.log_run_batch(c, run_id, params=params, metrics={**metrics, "expected_saving_vs_maxn": decision.expected_saving},
                               tags=records.session_tags(session, report), series={"power_w": report.power_series_w[:1000]})
        if refined is not None:
            _log_refine(c, run_id, refined, prepared.name, device.simulated)
        if save_model and result.model is not None:
            with tempfile.TemporaryDirectory() as tmp:
                save_model_artifacts(result, prepared, Path(tmp) / "model")
                c.log_artifacts(run_id, str(Path(tmp) / "model"), artifact_path="model")
        if not env_run:
            c.set_terminated(run_id, "FINISHED")
    except BaseException:
        if not env_run:
            c.set_terminated(run_id, "FAILED" if not isinstance(sys.exc_info()[1], KeyboardInterrupt) else "KILLED")
        raise
    label = " (SIMULATED)" if device.simulated else ""
    measured = f", measured {report.clock_mhz_measured:.0f} MHz" if report.clock_mhz_measured is not None else ""
    held = "; WARNING: the clock did not hold at the pinned value" if report.clock_held is False else ""
    where_clock = "under the clocks as found (observe)" if observe else f"at {settled:g} MHz"
    if refined is not None and refined.probes:
        where_clock += f" (after {refined.probe_steps} probe steps, included)"
    say(f"done{label}: {report.energy_j:.1f} J CPU+GPU in {report.duration_s:.2f} s of training {where_clock}{measured}; "
        f"{result.eval_metric} {result.eval_value:.3f}; run {run_id} in {FINETUNE_EXPERIMENT}"
        + ("" if observe else "; clocks restored") + held)
    summary.update({"run_id": run_id, "metrics": {k: v for k, v in metrics.items() if v is not None}})
    if refined is not None:
        summary["refine"] = {"start_mhz": refined.start_mhz, "chosen_mhz": refined.chosen_mhz, "reason": refined.reason,
                             "probes": [dataclasses.asdict(p) for p in refined.probes], "simulated": device.simulated}
    return summary


def default_refine(device: Any) -> int:
    """The probe budget `finetune` uses unless told: 30 steps on real boards, none on the twin."""
    return 0 if device.simulated else 30


def _log_refine(c: Any, run_id: str, refined: Any, workload: str, simulated: bool) -> None:
    """The probes and the choice: tags (and the run's name at the settled clock), and refine.csv."""
    tags = {**refined.tags(), "mlflow.runName": f"{workload}@{refined.chosen_mhz:g}"}
    if simulated:
        tags["refine.simulated"] = "true"
    tracking.log_run_batch(c, run_id, tags=tags, metrics={"refine_probe_steps": float(refined.probe_steps)})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "refine.csv"
        path.write_text(refined.to_csv())
        c.log_artifact(run_id, str(path))
