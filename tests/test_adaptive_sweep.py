"""`sweep --strategy adaptive` end to end on the twin: few clocks measured, none invented, resumable, usable by train."""
from __future__ import annotations

import csv
import io

from tests.conftest import run_cli

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]


def _runs(uri: str):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("dvfs-sweep")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    return c, [r for r in runs if "dvfs.point" in r.data.tags], [r for r in runs if "dvfs.point" not in r.data.tags]


def test_adaptive_sweep_measures_at_most_four_clocks_logs_predictions_apart_and_resumes(tmp_path, monkeypatch, empty_store):
    uri = empty_store
    env = {"MLFLOW_TRACKING_URI": uri}
    args = ("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2,rte", "--steps", "2", "--strategy", "adaptive")
    r = run_cli(*args, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    c, points, parents = _runs(uri)
    assert len(parents) == 1
    by_workload: dict[str, list[str]] = {}
    for p in points:
        assert p.data.tags["dvfs.strategy"] == "adaptive" and p.info.status == "FINISHED"
        by_workload.setdefault(p.data.tags["dvfs.workload"], []).append(p.data.params["freq_mhz"])
    assert set(by_workload) == {"bert-tiny/sst2", "bert-tiny/rte"}
    for clocks in by_workload.values():
        pinned = [float(f) for f in clocks if f != "maxn"]
        assert clocks.count("maxn") == 1 and 2 <= len(pinned) <= 4 and len(set(pinned)) == len(pinned)
        assert set(pinned) <= set(TABLE)

    # predictions live on the parent, marked as such; every measured clock is flagged measured, no other
    parent = parents[0]
    assert parent.data.tags["dvfs.strategy"] == "adaptive" and "curve model" in parent.data.tags["dvfs.predictions"]
    assert parent.data.tags["dvfs.power_prior"].startswith("none (")  # two workloads: too few for a board prior
    local = c.download_artifacts(parent.info.run_id, "predicted.csv", str(tmp_path))
    rows = list(csv.DictReader(io.StringIO(open(local).read())))
    assert len(rows) == 2 * len(TABLE)
    for w, clocks in by_workload.items():
        measured = {float(x["freq_mhz"]) for x in rows if x["workload"] == w and x["measured"] == "1"}
        assert measured == {float(f) for f in clocks if f != "maxn"}
        assert sum(x["predicted_optimum"] == "1" for x in rows if x["workload"] == w) == 1

    # the governor's dataset takes it: unmeasured clocks come from the curve model, measured ones stay measured
    from dvfs_mlops.mlops.dataset import load_sweep_dataset

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ds = load_sweep_dataset(parent.data.tags["dvfs.sweep_id"])
    assert ds.simulated and len(ds.curves) == 2
    union = sorted({float(p.data.params["freq_mhz"]) for p in points if p.data.params["freq_mhz"] != "maxn"})
    assert ds.frequencies == union
    assert any(len(by_workload[c.workload]) - 1 < len(union) for c in ds.curves), "no clock was left to predict"
    for curve in ds.curves:
        assert curve.clocks == union  # every clock the sweep measured for any workload: measured or predicted
        for p in points:
            if p.data.tags["dvfs.workload"] == curve.workload and p.data.params["freq_mhz"] != "maxn":
                assert curve.energy_j[float(p.data.params["freq_mhz"])] == p.data.metrics["energy_j"]
                assert curve.gpu_util_pct[float(p.data.params["freq_mhz"])] == p.data.metrics["gpu_util_pct"]  # for the power prior
        assert len(curve.gpu_util_pct) == len(by_workload[curve.workload]) - 1  # measured clocks only, never a fill-in

    # resume: the same choices from the finished points, nothing run twice
    r = run_cli(*args, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ran 0 points" in r.stdout
    assert len(_runs(uri)[1]) == len(points)


def test_curve_fit_of_a_sweep_equals_its_predictions_and_the_parent_carries_the_board(tmp_path, empty_store):
    """An adaptive sweep with --repeats 2 on a --twin-params board (its own voltage curve and noise): for every workload
    and clock, `curve fit --sweep-id S --workload W --json` predicts what the sweep's predicted.csv does (the same
    points, repeats averaged, the same board record, noise and prior). Before board.json, curve fit took the Orin's
    voltage shape, the workload's own top clock and each repeat as a point, and differed in the second digit. The
    adaptive parent carries the sweep's definition, its board and device id like a grid parent."""
    import json

    from dvfs_mlops.hw.board import Board

    (tmp_path / "board.yaml").write_text("gpu_k: 30.0\nvolt_v1: 0.2\nnoise_power: 0.03\n")
    env = {"MLFLOW_TRACKING_URI": empty_store}
    r = run_cli("sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m", "--tasks", "sst2,rte,mrpc", "--steps", "0",
                "--profile-steps", "20", "--strategy", "adaptive", "--repeats", "2", "--twin-params", str(tmp_path / "board.yaml"),
                "--device", "sim", "--sweep-id", "adaptive-board", env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    c, points, (parent,) = _runs(empty_store)
    assert parent.info.run_name == "sweep adaptive-board" and parent.data.tags["dvfs.device_id"].startswith("sim@")
    assert json.loads(parent.data.params["sweep_definition"])["strategy"] == "adaptive"
    board = Board.from_json(open(c.download_artifacts(parent.info.run_id, "board.json", str(tmp_path))).read())
    assert board.voltage_shape == 0.2 / 0.63 and board.voltage_shape_known and board.noise_power == 0.03
    assert parent.data.tags["dvfs.power_prior"].startswith("6 of 6 workloads")  # the prior is in both fits
    rows = list(csv.DictReader(io.StringIO(open(c.download_artifacts(parent.info.run_id, "predicted.csv", str(tmp_path))).read())))
    workloads = sorted({x["workload"] for x in rows})
    assert len(workloads) == 6 and {p.data.params["repeat"] for p in points} == {"0", "1"}
    for w in workloads:
        out = run_cli("curve", "fit", "--sweep-id", "adaptive-board", "--workload", w, "--json", env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        fit = {p["freq_mhz"]: p for p in json.loads(out.stdout)["points"]}
        mine = [x for x in rows if x["workload"] == w]
        assert sorted(fit) == [float(x["freq_mhz"]) for x in mine] == TABLE
        for x in mine:
            p = fit[float(x["freq_mhz"])]
            assert abs(p["energy_j"] / float(x["predicted_energy_j"]) - 1) < 1e-9, (w, x["freq_mhz"])
            assert abs(p["time_s"] / float(x["predicted_time_s"]) - 1) < 1e-9 and p["measured"] == (x["measured"] == "1")
            assert abs(p["energy_std_j"] / float(x["predicted_energy_std_j"]) - 1) < 1e-9


def test_a_sweep_under_mlflow_run_is_named_after_its_sweep(empty_store):
    """Under `mlflow run` the parent is MLflow's run (MLFLOW_RUN_ID), which MLflow names at random: the sweep renames it,
    and it carries the same definition, board and device id as a parent the sweep made."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=empty_store)
    exp = c.create_experiment("dvfs-sweep")
    outer = c.create_run(exp, run_name="lyrical-snake-986")
    r = run_cli("sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--freqs", "816", "--steps", "0",
                "--profile-steps", "5", "--device", "sim", env={"MLFLOW_TRACKING_URI": empty_store, "MLFLOW_RUN_ID": outer.info.run_id})
    assert r.returncode == 0, r.stderr[-2000:]
    parent = c.get_run(outer.info.run_id)
    sweep_id = parent.data.tags["dvfs.sweep_id"]
    assert parent.info.run_name == f"sweep {sweep_id}" and "sweep_definition" in parent.data.params
    assert parent.data.tags["dvfs.device_id"] and "board.json" in {a.path for a in c.list_artifacts(outer.info.run_id)}


def test_a_point_whose_claim_was_lost_is_measured_before_the_adaptive_sweep_reads_it(empty_store, monkeypatch):
    """Adaptive sweeps claim their points like grid ones. A point whose claim is lost while it runs (another worker took
    it over) ends KILLED with dvfs.claim_lost and is not counted as measured: the sweep waits until the point holds a
    FINISHED run (here its claim comes back to this worker, which measures it again) before it chooses the next clock."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.mlops import claims
    from dvfs_mlops.mlops.sweep import RunOptions, SweepRequest, build_spec, run_sweep

    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    asked = []
    real = claims.Lease.still_mine

    def lost_once(self):
        asked.append(self.point_key)
        return False if len(asked) == 2 else real(self)

    monkeypatch.setattr(claims.Lease, "still_mine", lost_once)
    dev = SimDevice()
    spec = build_spec(board_of(dev), SweepRequest("smoke", models="bert-tiny", tasks="sst2", steps=0, profile_steps=5,
                                                  strategy="adaptive"))
    out = run_sweep(spec, dev, options=RunOptions(announce=lambda m: None, wait_poll_s=0.05))
    _, points, _ = _runs(empty_store)
    lost = asked[1]
    assert [p.info.status for p in points if p.data.tags["dvfs.point"] == lost].count("FINISHED") == 1
    killed = [p for p in points if p.data.tags["dvfs.point"] == lost and p.info.status == "KILLED"]
    assert len(killed) == 1 and killed[0].data.tags["dvfs.claim_lost"] == "true"
    assert lost in out.ran and len({p.data.tags["dvfs.point"] for p in points}) == len(out.ran) >= 4  # maxn + >= 3 clocks
