"""The loop on a replayed grid (`--device replay --trace FILE`): sweep (grid and adaptive), train, evaluate, finetune
--dry-run and calibrate end to end on a small synthetic grid this file writes; every run says REPLAYED and carries the
grid's tags; `sweep --json` ends with one pick per workload; bad input is one line with nothing written to the store."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest

from tests.conftest import production_store, run_cli

GPU = (306.0, 408.0, 510.0, 612.0, 714.75, 816.0, 918.0)
# name, model_type, num_layers, hidden_size, split: two held-out workloads, as `evaluate` reads them
WORKLOADS = (("enc-a", "encoder", 2, 128, "train"), ("enc-b", "encoder", 4, 256, "train"), ("enc-c", "encoder", 8, 512, "eval"),
             ("dec-d", "decoder", 4, 256, "train"), ("dec-e", "decoder", 8, 512, "train"), ("dec-f", "decoder", 12, 768, "eval"))


def _time(i: int, g: float) -> float:
    """A made-up unit of work: a clock-free part and a part that scales with 1/f, both growing with the workload."""
    return 0.05 * (i + 1) + (1 + i) * 60.0 / g


def _energy(i: int, g: float) -> float:
    return _time(i, g) * (2.0 + 0.2 * i + 4e-6 * g * g * (1 + 0.3 * i))


@pytest.fixture
def grid(tmp_path) -> Path:
    """Six workloads at seven GPU clocks (114.75-style clocks included), with the governor's features, the GPU
    utilisation and the held-out split."""
    rows = ["workload,gpu_mhz,time_s,energy_j,model_type,num_layers,hidden_size,num_params,avg_seq_len,gpu_util_pct,split"]
    for i, (name, kind, layers, hidden, split) in enumerate(WORKLOADS):
        for g in GPU:
            rows.append(f"{name},{g:g},{_time(i, g)!r},{_energy(i, g)!r},{kind},{layers},{hidden},{layers * hidden * hidden * 12},"
                        f"{32 + 16 * i},{60 + 7 * i},{split}")
    path = tmp_path / "board-q.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _sweep_runs(uri: str) -> tuple[list, list]:
    """(point runs, parent runs) of the store's sweep experiment."""
    c = _client(uri)
    exp = c.get_experiment_by_name("dvfs-sweep")
    runs = c.search_runs([exp.experiment_id], max_results=1000) if exp is not None else []
    return [r for r in runs if "dvfs.point" in r.data.tags], [r for r in runs if "dvfs.point" not in r.data.tags]


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_grid_sweep_logs_one_replayed_run_per_point_and_ends_with_each_workloads_pick(grid, empty_store, tmp_path):
    env = {"MLFLOW_TRACKING_URI": empty_store}
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), "--claims", "none", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "REPLAYED" in r.stderr and "SIMULATED" not in r.stderr + r.stdout
    picks = _json_lines(r.stdout)
    assert [p["workload"] for p in picks] == [w[0] for w in WORKLOADS]  # as the file names them, in its order
    for i, pick in enumerate(picks):
        best = min(GPU, key=lambda g, i=i: _energy(i, g))
        assert set(pick) == {"workload", "best", "points_measured"} and set(pick["best"]) == {"gpu_mhz", "energy_j", "time_s"}
        assert pick["best"] == {"gpu_mhz": best, "energy_j": pytest.approx(_energy(i, best)), "time_s": pytest.approx(_time(i, best))}
        assert pick["points_measured"] == len(GPU)  # maxn is the file's top setting, not another one

    points, parents = _sweep_runs(empty_store)
    assert len(parents) == 1 and len(points) == len(WORKLOADS) * (len(GPU) + 1)
    sha = hashlib.sha256(grid.read_bytes()).hexdigest()
    for p in points:
        tags, params = p.data.tags, p.data.params
        assert p.info.status == "FINISHED" and tags["dvfs.simulated"] == "false"
        assert (tags["dvfs.device"], tags["dvfs.trace_sha256"], tags["dvfs.trace_name"]) == ("replay", sha, "board-q")
        assert params["device"] == "replay" and params["steps"] == "1" and "task" not in params
        i = [w[0] for w in WORKLOADS].index(tags["dvfs.workload"])
        clock = GPU[-1] if params["freq_mhz"] == "maxn" else float(params["freq_mhz"])
        assert p.data.metrics["energy_j"] == pytest.approx(_energy(i, clock)) and p.data.metrics["time_s"] == pytest.approx(_time(i, clock))
    assert {p.data.params["freq_mhz"] for p in points} == {"maxn", "306", "408", "510", "612", "714.75", "816", "918"}
    c = _client(empty_store)
    artifacts = {a.path for a in c.list_artifacts(parents[0].info.run_id)} | {a.path for a in c.list_artifacts(parents[0].info.run_id, "plots")}
    assert {"summary.csv", "board.json", "plots/enc-a.png", "plots/dec-f.png"} <= artifacts
    r = run_cli("twin", "fit", "--sweep-id", parents[0].data.tags["dvfs.sweep_id"], env=env)  # the grid's rows are no jobs
    assert r.returncode == 2 and "replays a measured grid (board-q); fit the twin on the grid itself" in r.stderr

    # --workloads picks by name: another sweep (its own id), two workloads, a resumed one measures nothing again
    args = ("sweep", "--device", "replay", "--trace", str(grid), "--claims", "none", "--workloads", "dec-d,enc-a", "--json")
    r = run_cli(*args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [p["workload"] for p in _json_lines(r.stdout)] == ["dec-d", "enc-a"]
    again = run_cli(*args, env=env)
    assert again.returncode == 0 and "ran 0 points, 16 were already finished" in again.stderr and again.stdout == r.stdout


def test_an_adaptive_sweep_looks_up_a_few_clocks_and_picks_the_predicted_optimum(grid, empty_store, tmp_path):
    env = {"MLFLOW_TRACKING_URI": empty_store}
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), "--claims", "none", "--strategy", "adaptive",
                "--workloads", "enc-b,dec-e", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(adaptive)" in r.stderr and "REPLAYED" in r.stderr and "SIMULATED" not in r.stderr
    points, parents = _sweep_runs(empty_store)
    assert all(p.data.tags["dvfs.strategy"] == "adaptive" and p.data.tags["dvfs.device"] == "replay" for p in points)
    local = _client(empty_store).download_artifacts(parents[0].info.run_id, "predicted.csv", str(tmp_path))
    predicted = list(csv.DictReader(io.StringIO(Path(local).read_text())))
    picks = {p["workload"]: p for p in _json_lines(r.stdout)}
    assert list(picks) == ["enc-b", "dec-e"]
    for name, pick in picks.items():
        measured = {p.data.params["freq_mhz"] for p in points if p.data.tags["dvfs.workload"] == name}
        settings = {GPU[-1] if f == "maxn" else float(f) for f in measured}
        assert 2 <= pick["points_measured"] == len(settings) <= 5
        optimum = [float(row["freq_mhz"]) for row in predicted if row["workload"] == name and row["predicted_optimum"] == "1"]
        assert optimum == [pick["best"]["gpu_mhz"]] and pick["best"]["gpu_mhz"] in GPU
        i = [w[0] for w in WORKLOADS].index(name)
        truth = min(_energy(i, g) for g in GPU)
        assert _energy(i, pick["best"]["gpu_mhz"]) <= 1.03 * truth  # a smooth grid: the pick is near the optimum


def test_train_evaluate_and_finetune_dry_run_on_a_replayed_sweep(grid, tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), "--claims", "none", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli("train", "--trials", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(REPLAYED sweep): 4 training workloads, 7 clocks" in r.stderr and "SIMULATED" not in r.stderr
    r = run_cli("registry", "promote", "1", "--force", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli("evaluate", "--policies", "maxn,ffg,oracle,models:/dvfs-governor/1", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["policy"]: row for row in json.loads(r.stdout)}
    assert rows["oracle"]["regret"] == 0.0 and rows["maxn"]["saving"] == 0.0 and rows["models:/dvfs-governor/1"]["n"] == 2
    r = run_cli("evaluate", "--policies", "maxn,oracle", env=env)
    assert r.returncode == 0 and "(REPLAYED), split eval" in r.stdout

    # finetune decides on a replayed workload (the grid's features and utilisation) and looks its decision up
    r = run_cli("finetune", "--device", "replay", "--trace", str(grid), "--task", "enc-c", "--dry-run", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    decided = out["decision"]["freq_mhz"]
    assert out["workload"] == "enc-c" and out["decision"]["governor"]["version"] == 1 and decided in GPU
    assert out["decision"]["features"]["num_layers"] == 8 and out["decision"]["gpu_util_source"] == "the grid's gpu_util_pct column"
    assert out["replayed"]["energy_j"] == pytest.approx(_energy(2, decided))
    assert out["replayed"]["saving_vs_top"] == pytest.approx(1 - _energy(2, decided) / _energy(2, GPU[-1]))
    assert "REPLAYED:" in r.stderr and "SIMULATED" not in r.stderr
    before = len(_sweep_runs(env["MLFLOW_TRACKING_URI"])[0])
    r = run_cli("finetune", "--device", "replay", "--trace", str(grid), "--task", "enc-c", env=env)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: nothing to train on a replay device"), r.stderr
    c = _client(env["MLFLOW_TRACKING_URI"])
    assert c.get_experiment_by_name("dvfs-finetune") is None and len(_sweep_runs(env["MLFLOW_TRACKING_URI"])[0]) == before


def test_calibrate_moves_another_familys_governor_to_a_replayed_board(grid, tmp_path):
    env = production_store(tmp_path)  # the published tree, in production for its own family
    r = run_cli("calibrate", "--device", "replay", "--trace", str(grid), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "for board-q (REPLAYED): 3 workloads x" in r.stdout and "SIMULATED" not in r.stdout + r.stderr
    assert "dvfs-governor v2: now production-board-q" in r.stdout
    points, parents = _sweep_runs(env["MLFLOW_TRACKING_URI"])
    assert len(parents) == 1 and parents[0].data.tags["dvfs.sweep_kind"] == "calibration"
    assert {p.data.tags["dvfs.workload"] for p in points} <= {w[0] for w in WORKLOADS}
    assert all(p.data.tags["dvfs.device"] == "replay" for p in points)


# --- bad input: one line each, nothing written to the store ----------------------------------------------------------

BAD = [
    ("workload,gpu_mhz,energy_j\nw,500,1.0\n", (), "lacks column(s) time_s"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,600,1.0,n/a\n", (), "line 3: energy_j must be a number, got 'n/a'"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,500,1.0,2.5\n", (), "lines 2 and 3: workload 'w' at 500 MHz twice"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,600,0.9,2.1\n", ("--freqs", "550"), "unknown frequency '550'; valid frequencies: 500, 600, maxn"),
    ("", (), "is empty"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\n", ("--workloads", "v"), "workload 'v' is not in"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\n", ("--models", "bert-tiny"), "pick them with --workloads"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\n", ("--steps", "5"), "--steps and --profile-steps do not apply"),
]


@pytest.mark.parametrize(("text", "extra", "message"), BAD, ids=[m[:36] for _, _, m in BAD])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, empty_store, text, extra, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    r = run_cli("sweep", "--device", "replay", "--trace", str(path), "--claims", "none", *extra, env={"MLFLOW_TRACKING_URI": empty_store})
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert _client(empty_store).get_experiment_by_name("dvfs-sweep") is None


def test_workloads_belong_to_a_replay_and_the_twins_train_once_is_named_so(empty_store):
    r = run_cli("sweep", "--device", "sim", "--workloads", "enc-a", "--claims", "none", env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 2 and "--workloads picks the workloads of a replayed grid" in r.stderr
    assert _client(empty_store).get_experiment_by_name("dvfs-sweep") is None
    help_text = run_cli("sweep", "--help").stdout
    assert "--train-once / --no-train-once" in help_text and "--replay" not in help_text


def test_points_logged_with_the_old_train_once_tag_read_under_its_new_name():
    import pandas as pd

    from dvfs_mlops.mlops.queries import renamed_tags

    df = pd.DataFrame({"tags.dvfs.sim_replay": ["true", None], "tags.dvfs.sim_train_once": [None, "false"]})
    assert renamed_tags(df).to_dict("list") == {"tags.dvfs.sim_train_once": ["true", "false"]}
    assert renamed_tags(pd.DataFrame({"tags.dvfs.sim_replay": ["true"]})).to_dict("list") == {"tags.dvfs.sim_train_once": ["true"]}
