"""What a session found and what became of its pin, on the run (issue 42's MLflow side and issue 39's last piece): the
cap at the start (tag dvfs.cap_at_start, metric cap_at_start_mhz), the power mode (a sweep's identity, the governor's
training filter, a tag), --above-mode-cap on sweep and finetune, where the energy comes from, per-GPU names by node
and UUID, and a clock service lost while the session ran (tag dvfs.clock_lost, metric clock_unheld_s, one line)."""
from __future__ import annotations

import dataclasses
import time

import pytest

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import PowerMode, board_of
from dvfs_mlops.hw.jetson import JetsonDevice
from dvfs_mlops.hw.meter import EnergyReport
from dvfs_mlops.hw.multi import GpuEnergy
from dvfs_mlops.mlops import fields, records, schema
from tests.conftest import run_cli

MODE_30W = PowerMode(2, "MODE_30W", gpu_max_mhz=612.0, tpc_pg_mask=3)


def _written(session, board) -> records.RunRecord:
    """What a point or fine-tune run records of a session (the writer `records.job_record` uses)."""
    report = session.report()
    return records.RunRecord({**records.session_params(session), **records.report_params(report)},
                             {**records.report_metrics(report), **records.session_metrics(session)},
                             records.session_tags(session, report, board))


def _all_declared(record: records.RunRecord) -> None:
    assert [k for k in record.params if not fields.declared(k, "param")] == []
    assert [k for k in record.metrics if not fields.declared(k, "metric")] == []


def test_a_cap_found_at_the_start_and_the_power_mode_are_recorded_on_the_run(orin6_kernel):
    k = orin6_kernel
    k.set_throttle_cap_hz(918000000)  # a thermal cap before the session: max_freq reads it (get_freq_range)
    dev = JetsonDevice(sample_hz=200)
    with dev.session("maxn") as s:
        time.sleep(0.05)
    record = _written(s, board_of(dev, "cpu"))
    assert record.tags[schema.TAG_CAP_AT_START] == "918" and record.metrics["cap_at_start_mhz"] == pytest.approx(918)
    assert record.params["energy_source"] == "samples" and record.params["nvpmodel_mode"] == "0:MAXN"
    assert schema.TAG_POWER_MODE not in record.tags  # MAXN: the tag (and the sweep id) as without a mode
    _all_declared(record)

    k.set_throttle_cap_hz(None)
    k.set_nvpmodel_mode(2)  # MODE_30W
    dev = JetsonDevice(sample_hz=200, above_mode_cap=True)
    with dev.session(918) as s:
        time.sleep(0.05)
    board = board_of(dev, "cpu")
    record = _written(s, board)
    assert record.tags[schema.TAG_ABOVE_MODE_CAP] == "true" and schema.TAG_CAP_AT_START not in record.tags
    assert record.tags[schema.TAG_POWER_MODE] == board.power_mode_key and board.power_mode_key.startswith("nvpmodel 2:MODE_30W")
    _all_declared(record)


def test_the_power_mode_is_part_of_a_sweeps_identity_and_maxn_keeps_todays_ids():
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.mlops.sweep import SweepRequest, build_spec

    board = board_of(SimDevice())
    request = SweepRequest("smoke", models="bert-tiny", tasks="sst2")
    plain = build_spec(board, request)
    maxn = build_spec(dataclasses.replace(board, power_mode=PowerMode(0, "MAXN", gpu_max_mhz=1300.5)), request)
    mode = build_spec(dataclasses.replace(board, power_mode=MODE_30W), request)
    assert plain.sweep_id == maxn.sweep_id and "power_mode" not in plain.definition()
    assert mode.sweep_id != plain.sweep_id and mode.definition()["power_mode"] == MODE_30W.identity()
    assert mode.sweep_id.startswith("sweep-") and len(mode.sweep_id) == len("sweep-") + 10


def test_above_mode_cap_is_a_device_option_of_sweep_and_finetune():
    for command in ("sweep", "finetune", "calibrate", "run"):
        assert "--above-mode-cap" in run_cli(command, "--help").stdout, command


def test_the_governor_learns_one_power_mode_and_a_capped_maxn_is_no_baseline(tmp_path, empty_store, monkeypatch):
    """Points of two power modes are refused in one line; a maxn point taken under a cap is not the workload's
    baseline (the workload then lacks one and is named)."""
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.mlops.dataset import load_sweep_dataset

    grid = tmp_path / "board-m.csv"
    rows = ["workload,gpu_mhz,time_s,energy_j,gpu_util_pct"]
    rows += [f"{w},{g},{1 + 100 / g},{(1 + 100 / g) * (2 + g / 500)},70" for w in ("a", "b") for g in (300, 600, 900)]
    grid.write_text("\n".join(rows) + "\n")
    r = run_cli("sweep", "--device", "replay", "--trace", str(grid), "--claims", "none", env={"MLFLOW_TRACKING_URI": empty_store})
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    assert len(load_sweep_dataset().curves) == 2
    c = MlflowClient(tracking_uri=empty_store)
    points = c.search_runs([c.get_experiment_by_name("dvfs-sweep").experiment_id], "tags.`dvfs.point` != ''")
    a_maxn = next(p for p in points if p.data.tags["dvfs.point"] == "a@maxn#0")
    c.set_tag(a_maxn.info.run_id, schema.TAG_CAP_AT_START, "600")
    with pytest.raises(DvfsError, match=r"unusable workload\(s\), missing: a@maxn \(capped at the start\)"):
        load_sweep_dataset()
    c.delete_tag(a_maxn.info.run_id, schema.TAG_CAP_AT_START)
    b_900 = next(p for p in points if p.data.tags["dvfs.point"] == "b@900#0")
    c.set_tag(b_900.info.run_id, schema.TAG_POWER_MODE, MODE_30W.identity())
    with pytest.raises(DvfsError) as e:
        load_sweep_dataset()
    assert "mix 2 power modes (MAXN (or no mode); nvpmodel 2:MODE_30W" in str(e.value) and "\n" not in str(e.value)


def test_per_gpu_metrics_and_tags_are_keyed_by_node_and_uuid():
    report = EnergyReport(duration_s=2.0, energy_j=10.0, energy_total_j=12.0, avg_power_w=6.0, peak_power_w=7.0, gpu_util_pct=50.0,
                          samples=10, energy_by_rail_j={"VDD_GPU": 10.0}, simulated=False)
    gpus = [GpuEnergy(0, "GPU-aaa", report, rank=0, host="node-1"), GpuEnergy(0, "GPU-bbb", report, rank=1, host="node-2")]
    metrics, tags = records.gpu_metrics(gpus, "dvfs_"), records.gpu_tags(gpus)
    assert metrics["dvfs_energy_j/node-1/GPU-aaa"] == 10.0 and metrics["dvfs_energy_j/node-2/GPU-bbb"] == 10.0  # both GPU 0
    assert len(metrics) == 2 * 6 and all(fields.declared(name, "metric") for name in metrics)
    assert tags == {"dvfs.gpu_count": "2", "dvfs.gpu.node-1/GPU-aaa.index": "0", "dvfs.gpu.node-1/GPU-aaa.rank": "0",
                    "dvfs.gpu.node-2/GPU-bbb.index": "0", "dvfs.gpu.node-2/GPU-bbb.rank": "1"}


def test_a_lost_clock_service_is_recorded_on_the_run_and_said_in_one_line():
    """A pin the service lost and took again: the session's context says so (`PinnedSession._say_lost`, exercised with
    a real service in test_clockd_lost.py); the run carries it as a tag and a metric, and one line says it."""
    from dvfs_mlops.hw.sim import SimDevice

    dev = SimDevice()
    with dev.session(612, label="w#0") as s:
        s.step()
    assert records.clock_lost_line(s) is None and schema.TAG_CLOCK_LOST not in _written(s, board_of(dev)).tags
    s.context.update({"clock_lost": "the clock service lost the pin 1 time(s); pinned again each time", "clock_unheld_s": 2.5})
    record = _written(s, board_of(dev))
    assert record.tags[schema.TAG_CLOCK_LOST].startswith("the clock service lost the pin 1 time(s)")
    assert record.metrics["clock_unheld_s"] == 2.5
    _all_declared(record)
    line = records.clock_lost_line(s)
    assert line is not None and "\n" not in line and "2.5 s" in line and "not held" in line
