"""The replay device (`--device replay --trace FILE`): a measured grid played as a device, and every bad grid refused in
one line before anything runs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.errors import DvfsError, UnknownNameError
from dvfs_mlops.hw import describe_device, open_device
from dvfs_mlops.hw.replay import REPLAYED, ReplayDevice, Setting, read_grid
from dvfs_mlops.model.workload import FEATURE_COLUMNS

REPO = Path(__file__).resolve().parents[1]
GPU = (306.0, 612.0, 918.75)
CPU = (1000.0, 2201.6)
EMC = (800.0, 3199.0)


def _time(workload: str, g: float, c: float, e: float) -> float:
    """A made-up grid with every knob mattering: time falls with each clock (the workload's own scale)."""
    scale = 2.0 if workload == "dec-b" else 1.0
    return scale * (0.1 + 100.0 / g + 50.0 / c + 20.0 / e)


def _energy(workload: str, g: float, c: float, e: float) -> float:
    return _time(workload, g, c, e) * (5.0 + 0.01 * g + 0.002 * c + 0.001 * e)


@pytest.fixture
def grid(tmp_path) -> Path:
    """Two workloads at every GPU x CPU x EMC setting, with features, one measurement each."""
    rows = ["workload,gpu_mhz,cpu_mhz,emc_mhz,time_s,energy_j,power_w,model_type,num_layers"]
    for w, kind, layers in (("enc-a", "encoder", 4), ("dec-b", "decoder", 6)):
        for g in GPU:
            for c in CPU:
                for e in EMC:
                    t, j = _time(w, g, c, e), _energy(w, g, c, e)
                    rows.append(f"{w},{g:g},{c:g},{e:g},{t!r},{j!r},{j / t!r},{kind},{layers}")
    path = tmp_path / "board-z.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _device(path: Path) -> ReplayDevice:
    """The device as the command line opens it: the governor's feature columns allowed."""
    return ReplayDevice(path, workload_columns=FEATURE_COLUMNS)


def _write(tmp_path: Path, text: str, name: str = "grid.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_table_is_the_files_gpu_clocks_and_maxn_its_top_setting(grid):
    dev = _device(grid)
    assert dev.name == "replay" and dev.replayed and not dev.simulated and dev.profile == "board-z"
    assert dev.frequencies_mhz == list(GPU)  # the file's distinct values, ascending: nothing added for maxn
    assert dev.grid.cpu_mhz == CPU and dev.grid.emc_mhz == EMC and dev.grid.workloads == ("enc-a", "dec-b")
    assert dev.device_id == "replay@" + hashlib.sha256(grid.read_bytes()).hexdigest()[:12]
    assert dev.setting("maxn") == Setting(918.75, 2201.6, 3199.0) == dev.grid.top
    with dev.session("maxn", workload="dec-b") as s:
        pass
    r = s.report()
    assert r.energy_j == pytest.approx(_energy("dec-b", 918.75, 2201.6, 3199.0))
    assert r.duration_s == pytest.approx(_time("dec-b", 918.75, 2201.6, 3199.0))
    assert r.clock_held is None and r.clock_mhz_measured == 918.75 and r.emc_mhz == 3199.0


def test_the_gpu_knob_alone_plays_the_slice_at_the_highest_cpu_and_emc_clocks(grid):
    dev = _device(grid)
    with dev.session(612, workload="enc-a") as s:
        for _ in range(3):
            s.step()
    r = s.report()
    one_t, one_e = _time("enc-a", 612.0, 2201.6, 3199.0), _energy("enc-a", 612.0, 2201.6, 3199.0)
    assert r.samples == 3 and r.duration_s == pytest.approx(3 * one_t) and r.energy_j == pytest.approx(3 * one_e)
    assert r.avg_power_w == pytest.approx(one_e / one_t) and r.clock_held is True and r.simulated is False
    assert r.energy_gpu_j is None and r.energy_rails == ("recorded",)  # the file's energy: its rails cannot be told apart
    assert s.context["cpu_mhz"] == 2201.6 and s.context["emc_mhz"] == 3199.0 and s.context["workload"] == "enc-a"
    assert s.context["trace_sha256"] == hashlib.sha256(grid.read_bytes()).hexdigest() and s.context["trace_name"] == "board-z"
    assert [x.setting.gpu_mhz for x in dev.grid.gpu_slice("dec-b")] == list(GPU)
    assert dev.looked_up("enc-a") == (Setting(612.0, 2201.6, 3199.0),) and dev.looked_up("dec-b") == ()


def test_a_session_without_steps_is_one_unit_and_windows_and_repin_look_up_again(grid):
    """A session that charges no step reports one unit of work; a repin looks the new setting up, each window meters
    its own units (what refine's probes read)."""
    dev = _device(grid)
    with dev.session(306, label="dec-b#0") as s:
        pass
    assert s.report().samples == 1 and s.report().energy_j == pytest.approx(_energy("dec-b", 306.0, 2201.6, 3199.0))
    with dev.session(306, workload="enc-a") as s:
        with s.window("probe@306"):
            s.step()
            s.step()
        s.repin(918.75)
        with s.window("probe@918.75"):
            s.step()
        low, high = s.window_report("probe@306"), s.window_report("probe@918.75")
    assert low.samples == 2 and low.energy_j == pytest.approx(2 * _energy("enc-a", 306.0, 2201.6, 3199.0))
    assert high.samples == 1 and high.energy_j == pytest.approx(_energy("enc-a", 918.75, 2201.6, 3199.0))
    assert high.clock_held is True and s.pins == [918.75] and [x.setting.gpu_mhz for x in s.lookups] == [306.0, 918.75]
    assert s.session_report().samples == 3


def test_repeats_play_in_order_then_their_mean(tmp_path):
    path = _write(tmp_path, "workload,gpu_mhz,time_s,energy_j,repeat\n"
                            "w,500,1.0,10.0,1\nw,500,2.0,30.0,0\nw,1000,0.5,8.0,0\n")
    dev = ReplayDevice(path)
    played = [dev.measure("w", 500) for _ in range(3)]
    assert [(p.time_s, p.energy_j, p.repeat) for p in played] == [(2.0, 30.0, 0), (1.0, 10.0, 1), (1.5, 20.0, None)]
    assert all(p.recorded == 2 for p in played)
    assert dev.measure("w", 500, repeat=1).energy_j == 10.0  # a named repeat, whatever was looked up before
    with dev.session(500, label="w#0") as s:  # a sweep point's label names its repeat
        pass
    assert s.report().energy_j == 30.0 and s.context["repeat"] == "0"
    with dev.session(500, label="w#7") as s:
        pass
    assert s.report().energy_j == 20.0 and s.context["repeat"] == "mean"
    assert dev.looked_up("w") == (Setting(500.0),)


def test_identical_duplicate_rows_count_once_and_freq_mhz_names_the_gpu_clock(tmp_path):
    path = _write(tmp_path, "workload,freq_mhz,time_s,energy_j\nw,500,1.0,10.0\nw,500,1.0,10.0\nw,1000,0.5,8.0\n")
    dev = ReplayDevice(path)
    assert dev.frequencies_mhz == [500.0, 1000.0] and len(dev.grid.rows) == 2 and dev.grid.recorded("w", Setting(500.0))[0].line == 2


def test_replayed_is_what_is_printed(grid):
    dev = open_device("replay", trace=grid, trace_columns=FEATURE_COLUMNS)
    assert "measurements are REPLAYED" in describe_device(dev, "replay") and "SIMULATED" not in describe_device(dev, "replay")
    r = CliRunner().invoke(main, ["devices", "--device", "replay", "--trace", str(grid)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"backend:      replay ({REPLAYED})" and "SIMULATED" not in r.output
    assert "frequencies:  306, 612, 918.75 MHz" in r.stdout and "trace_sha256:" in r.stdout
    assert r.stderr.strip() == f"device: replay (board-z: 2 workload(s) from {grid}, measurements are REPLAYED)"
    r = CliRunner().invoke(main, ["devices", "--device", "replay", "--trace", str(grid), "--json"])
    info = json.loads(r.stdout)
    assert info["backend"] == "replay" and info["simulated"] is False and info["frequencies_mhz"] == list(GPU)
    assert info["detail"]["trace_name"] == "board-z" and info["detail"]["trace_sha256"] == hashlib.sha256(grid.read_bytes()).hexdigest()


def test_the_grids_features_are_the_workloads(grid):
    """Feature columns describe the workloads; where the caller does not allow them they are unknown columns."""
    from dvfs_mlops.app.devices import DeviceChoice, open_chosen

    dev = open_chosen(DeviceChoice(backend="replay", trace=str(grid)))
    assert dev.grid.features == {"enc-a": {"model_type": "encoder", "num_layers": "4"},
                                 "dec-b": {"model_type": "decoder", "num_layers": "6"}}
    with pytest.raises(DvfsError, match=r"unknown column\(s\) model_type, num_layers; the columns read here are workload, gpu_mhz"):
        ReplayDevice(grid)


def test_run_on_a_replay_device_is_refused_before_anything_runs(grid, tmp_path):
    marker = tmp_path / "ran"
    for args in (["run", "--device", "replay", "--freq", "612", "--", "touch", str(marker)],
                 ["run", "--device", "replay", "--trace", str(grid), "--", "touch", str(marker)]):
        r = CliRunner().invoke(main, args)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.exit_code == 2 and lines == [("Error: nothing to run on a replay device: it plays the measurements of a grid "
                                              "and runs nothing; use --device jetson, nvml or sim")], r.output
        assert not marker.exists()


def test_refine_drives_a_replay_session(grid):
    """The device contract refine relies on (repin, windows read while open) holds on a replayed board: the probes read
    the grid's own per-step values, and it settles on a clock of the table."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.refine import Refiner

    dev = _device(grid)
    board = board_of(dev)
    with dev.session(612, workload="enc-a") as s:
        refiner = Refiner(s, budget=20, total_steps=40, board=board, say=lambda _line: None)
        step = 0
        while refiner.active and step < 40:
            s.step()
            refiner.on_step(step)
            step += 1
    result = refiner.result
    assert result is not None and result.chosen_mhz in GPU and len(result.probes) >= 2
    for probe in result.probes:
        assert probe.per_step().energy_j == pytest.approx(_energy("enc-a", probe.freq_mhz, 2201.6, 3199.0))


def test_every_shipped_grid_is_a_valid_grid_under_one_megabyte():
    shipped = sorted((REPO / "benchmarks" / "data" / "public").glob("*.csv"))
    grids = {p.stem: read_grid(p) for p in shipped if "workload" in p.read_text().partition("\n")[0]}
    assert {"bofl-agx-xavier", "perseus-a100-sxm", "perseus-a40"} <= set(grids)
    for name, g in grids.items():
        assert Path(g.path).stat().st_size < 1_000_000, name
    bofl = grids["bofl-agx-xavier"]
    assert len(bofl.rows) == 3 * 14 * 29 * 6 and len(bofl.gpu_mhz) == 14 and bofl.top == Setting(1377.0, 2265.6, 2133.0)
    assert {min(bofl.gpu_slice(w), key=lambda x: x.energy_j).setting.gpu_mhz for w in bofl.workloads} == {905.25}


# --- bad grids and bad requests: one line each, before anything runs ------------------------------------------------

BAD_GRIDS = [
    ("", "is empty"),
    ("workload,gpu_mhz,time_s,energy_j\n", "has no rows"),
    ("workload,gpu_mhz,energy_j\nw,500,1.0\n", "lacks column(s) time_s"),
    ("workload,time_s,energy_j\nw,1.0,2.0\n", "lacks column(s) gpu_mhz"),
    ("workload,gpu_mhz,time_s,energy_j\nw,fast,1.0,2.0\n", "line 2: gpu_mhz must be a number, got 'fast'"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,600,1.0,n/a\n", "line 3: energy_j must be a number, got 'n/a'"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,-1.0,2.0\n", "line 2: time_s must be a positive number"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,500,1.0,2.5\n", "lines 2 and 3: workload 'w' at 500 MHz twice with different values"),
    ("workload,gpu_mhz,time_s,energy_j,repeat\nw,500,1.0,2.0,0\nw,500,1.1,2.0,0\n", "at 500 MHz repeat 0 twice with different values"),
    ("workload,gpu_mhz,time_s,energy_j,repeat\nw,500,1.0,2.0,first\n", "repeat must be a whole number"),
    ("workload,gpu_mhz,time_s,energy_j,power_w\nw,500,1.0,2.0,3.0\n", "power_w 3 disagrees with energy_j / time_s = 2"),
    ("workload,gpu_mhz,time_s,energy_j,enery_j\nw,500,1.0,2.0,2.0\n", "unknown column(s) enery_j"),
    ("workload,gpu_mhz,freq_mhz,time_s,energy_j\nw,500,500,1.0,2.0\n", "has both gpu_mhz and freq_mhz"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0\n", "line 2: 3 fields, the header has 4"),
    ("workload,gpu_mhz,time_s,energy_j\n,500,1.0,2.0\n", "line 2: the workload is empty"),
    ("workload,gpu_mhz,time_s,energy_j\nw,500,1.0,2.0\nw,500.2,1.0,2.0\n", "GPU clocks 500 and 500.2 MHz are closer than 0.5 MHz"),
    ("workload,gpu_mhz,time_s,energy_j,model_type\nw,500,1.0,2.0,encoder\nw,600,1.0,2.0,decoder\n",
     "workload 'w' has model_type 'encoder', then 'decoder'"),
    ("workload,gpu_mhz,time_s,energy_j,num_layers\nw,500,1.0,2.0,many\n", "workload 'w' has num_layers 'many'; it must be a number"),
    ("workload,gpu_mhz,time_s,energy_j,model_type\nw,500,1.0,2.0,cnn\n", "has model_type 'cnn'; it is one of encoder, decoder"),
]


@pytest.mark.parametrize(("text", "message"), BAD_GRIDS, ids=[m[:40] for _, m in BAD_GRIDS])
def test_a_bad_grid_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, text, message):
    path = _write(tmp_path, text)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = CliRunner().invoke(main, ["devices", "--device", "replay", "--trace", str(path)])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], r.output
    assert "Traceback" not in r.output and r.stdout == "" and list(work.iterdir()) == []


def test_a_file_that_cannot_be_read_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["devices", "--device", "replay", "--trace", str(tmp_path / "none.csv")])
    assert r.exit_code == 2 and r.stderr.startswith("Error: cannot read the trace") and len(r.stderr.splitlines()) == 1
    (tmp_path / "folder").mkdir()
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"workload,gpu_mhz,time_s,energy_j\n\xff\xfe,1,1,1\n")
    huge = _write(tmp_path, 'workload,gpu_mhz,time_s,energy_j\n"' + "x" * 200_000 + '",1,1,1\n', "huge.csv")
    for path, message in ((tmp_path / "folder", "cannot read the trace"), (binary, "is not UTF-8 text"),
                          (huge, "line 2: not a CSV row")):
        r = CliRunner().invoke(main, ["devices", "--device", "replay", "--trace", str(path)])
        assert r.exit_code == 2 and message in r.stderr and len(r.stderr.splitlines()) == 1, r.output
    r = CliRunner().invoke(main, ["devices", "--device", "replay"])
    assert r.exit_code == 2 and "give it --trace FILE.csv" in r.stderr
    r = CliRunner().invoke(main, ["devices", "--device", "sim", "--trace", str(tmp_path / "none.csv")])
    assert r.exit_code == 2 and "add --device replay (not sim)" in r.stderr


def test_a_setting_or_workload_not_in_the_file_is_refused_in_one_line(grid, tmp_path):
    dev = _device(grid)
    with pytest.raises(UnknownNameError, match=r"unknown frequency 700; valid frequencies: 306, 612, 918.75, maxn"):
        dev.session(700, workload="enc-a")
    with pytest.raises(DvfsError, match=r"workload 'bert-tiny/sst2' is not in .*; its workloads: enc-a, dec-b"):
        dev.session(612, label="bert-tiny/sst2#0")
    with pytest.raises(DvfsError, match=r"holds 2 workloads \(enc-a, dec-b\); name the one to replay"):
        dev.session(612)
    ragged = ReplayDevice(_write(tmp_path, "workload,gpu_mhz,time_s,energy_j\na,500,1.0,2.0\na,900,0.6,1.9\nb,900,0.5,1.5\n"))
    with pytest.raises(DvfsError, match=r"has no row for workload 'b' at 500 MHz"):
        ragged.session(500, workload="b")
    assert ragged.looked_up("b") == ()  # refused before entering: nothing looked up


def test_the_cpu_and_emc_keywords_play_that_setting_and_a_repin_looks_the_new_one_up_once(grid):
    dev = _device(grid)
    assert dev.cpu_frequencies_mhz == list(CPU) and dev.emc_frequencies_mhz == list(EMC)
    with dev.session(612, workload="enc-a", cpu_mhz=1000, emc_mhz=800) as s:
        s.step()
        s.repin(918.75, cpu_mhz=2201.6)  # the EMC clock stays
        s.step()
    assert [x.setting for x in s.lookups] == [Setting(612.0, 1000.0, 800.0), Setting(918.75, 2201.6, 800.0)]
    assert dev.looked_up("enc-a") == (Setting(612.0, 1000.0, 800.0), Setting(918.75, 2201.6, 800.0))  # no setting between
    assert s.report().energy_j == pytest.approx(_energy("enc-a", 612, 1000, 800) + _energy("enc-a", 918.75, 2201.6, 800))
    assert s.context["cpu_mhz"] == 2201.6 and s.context["emc_mhz"] == 800.0 and s.cpu_mhz == 2201.6


def test_a_cpu_or_emc_clock_not_in_the_file_or_a_file_without_that_column_is_one_line(grid, tmp_path):
    dev = _device(grid)
    with pytest.raises(UnknownNameError, match=r"unknown CPU clock '1500'; valid CPU clocks: 1000, 2201\.6"):
        dev.session(612, workload="enc-a", cpu_mhz=1500)
    with pytest.raises(UnknownNameError, match=r"unknown memory \(EMC\) clock '2133'; valid memory \(EMC\) clocks: 800, 3199"):
        dev.session(612, workload="enc-a", emc_mhz=2133)
    gpu_only = _write(tmp_path, "workload,gpu_mhz,time_s,energy_j\nw,306,1.0,10.0\nw,612,0.6,9.0\n")
    with pytest.raises(DvfsError, match=r"has no cpu_mhz column: its CPU clock was not varied.*drop --cpu-freq"):
        ReplayDevice(gpu_only).session(612, cpu_mhz=1000)
    assert dev.looked_up("enc-a") == ()
