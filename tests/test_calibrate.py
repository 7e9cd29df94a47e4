"""End to end on the twin, the issue's Done-when: a fresh install's governor (the published tree, `registry bootstrap` +
`registry promote`, a classifier tree of the AGX Orin 64 GB) is the only one registered; an Orin Nano refines without it
and says why (another board's governor only with --allow-other-board, recorded on the run); `calibrate` moves the
published tree to the Nano from a few measured points and registers and promotes the Nano's own version, which the
next fine-tune uses.
"""
from __future__ import annotations

import json

from tests.conftest import run_cli

NANO = ["--device", "sim", "--twin-profile", "sim-orin-nano-8gb"]
FINETUNE = ["finetune", "--model", "bert-tiny", "--task", "sst2", *NANO, "--steps", "40", "--train-size", "128", "--probe-steps", "0",
            "--no-save-model", "--json"]
FAMILY = "jetson-orin-nano-8gb"


def _run_tags(env: dict[str, str], stdout: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    run_id = json.loads(stdout)["run_id"]
    return dict(MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"]).get_run(run_id).data.tags)


def test_a_nano_refines_without_its_governor_then_uses_its_calibrated_one(empty_store):
    from mlflow.tracking import MlflowClient

    env = {"MLFLOW_TRACKING_URI": empty_store}
    for args in (("registry", "bootstrap"), ("registry", "promote", "1")):  # what a fresh install has as production
        r = run_cli(*args, env=env)
        assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    assert "production -> v1" in r.stdout, r.stdout

    r = run_cli(*FINETUNE, env=env)
    assert r.returncode == 0, r.stderr
    why = (f"no production governor for {FAMILY} (registered: jetson-agx-orin-64gb v1); refining from the curve model; "
           "`dvfs-mlops calibrate` makes one, --allow-other-board uses another board's")
    assert why in r.stderr.splitlines() and "decision: refine, starting at " in r.stderr
    tags = _run_tags(env, r.stdout)
    assert tags["decision.path"] == "refine" and tags["decision.reason"] == why and tags["governor.version"] == ""
    assert tags["dvfs.board_family"] == FAMILY and "refine.chosen_mhz" in tags and "governor.other_board" not in tags

    r = run_cli(*FINETUNE, "--refine", "0", "--dry-run", env=env)  # refine is what would pick the clock: not off
    assert r.returncode == 2 and "refine is off (0 steps): nothing would pick the clock" in r.stderr and "Traceback" not in r.stderr

    r = run_cli(*FINETUNE, "--allow-other-board", env=env)  # on purpose: the AGX Orin's tree, and the run says so
    assert r.returncode == 0, r.stderr
    assert f"is of jetson-agx-orin-64gb, this board is {FAMILY} (--allow-other-board)" in r.stderr
    tags = _run_tags(env, r.stdout)
    assert tags["governor.version"] == "1" and tags["governor.other_board"] == "true" and tags["decision.path"] != "refine"

    r = run_cli("calibrate", *NANO, "--steps", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert f"calibrated v1 (jetson-agx-orin-64gb) for {FAMILY} (SIMULATED)" in r.stdout
    assert f"dvfs-governor v2: now production-{FAMILY}" in r.stdout
    c = MlflowClient(tracking_uri=empty_store)
    v2 = c.get_model_version("dvfs-governor", "2")
    assert v2.tags["dvfs.board_family"] == FAMILY and v2.tags["calibrated_from"] == "1"
    sweeps = v2.tags["calibration_sweep"].split(",")
    assert sweeps and all(s.startswith("sweep-") for s in sweeps)
    points = c.search_runs([c.get_experiment_by_name("dvfs-sweep").experiment_id],
                           filter_string="attributes.status = 'FINISHED' and params.device_profile = 'sim-orin-nano-8gb'")
    workloads = {p.data.tags["dvfs.workload"] for p in points}
    clocks = {p.data.params["freq_mhz"] for p in points} - {"maxn"}
    assert 1 <= len(workloads) <= 3 and 2 <= len(clocks) <= 4, (workloads, clocks)
    metrics = c.get_run(v2.run_id).data.metrics
    assert metrics["calibration_regret"] <= metrics["calibration_source_regret"] + 1e-12
    aliases = c.get_registered_model("dvfs-governor").aliases
    assert aliases[f"production-{FAMILY}"] == 2 and aliases["production"] == 1, "the AGX Orin's production is untouched"

    r = run_cli(*FINETUNE, env=env)
    assert r.returncode == 0, r.stderr
    assert "no production governor" not in r.stderr and f"governor: dvfs-governor v2 (@production-{FAMILY})" in r.stderr
    tags = _run_tags(env, r.stdout)
    assert tags["governor.version"] == "2" and tags["governor.alias"] == f"production-{FAMILY}"
    assert tags["decision.path"] != "refine" and "decision.reason" not in tags and "governor.other_board" not in tags

    r = run_cli("calibrate", *NANO, "--steps", "0", "--no-promote", env=env)  # resumed: nothing measured twice
    assert r.returncode == 0, r.stderr
    assert "every point already measured (resumed)" in r.stdout and "not promoted (--no-promote)" in r.stdout
    assert c.get_registered_model("dvfs-governor").aliases[f"production-{FAMILY}"] == 2
