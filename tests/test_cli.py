from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dvfs_mlops.cli import main
from tests.conftest import run_cli
from tests.fakes.sysfs import ORIN_TABLE_HZ


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return invoke


def test_devices_sim_json(cli):
    r = cli("devices", "--device", "sim", "--json")
    assert r.exit_code == 0
    info = json.loads(r.output)
    assert info["backend"] == "sim" and info["simulated"] is True and info["profile"] == "sim-orin"
    assert info["frequencies_mhz"][0] == 306.0 and info["frequencies_mhz"][-1] == 1300.5
    assert "VDD_GPU_SOC" in info["rails"]


def test_devices_text_labels_simulation(cli):
    r = cli("devices", "--device", "sim")
    assert "SIMULATED" in r.output


def test_devices_on_fake_jetson(cli, orin):
    r = cli("devices", "--json")
    info = json.loads(r.output)
    assert info["backend"] == "jetson" and info["current_mhz"] == 1300.5 and info["governor"] == "nvhost_podgov"
    assert sorted(info["rails"]) == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC", "VIN_SYS_5V0"]


def test_simulate_json_shape(cli):
    r = cli("simulate", "bert-mini", "--seq-len", "32", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"] == "bert-mini" and d["simulated"] is True
    assert [p["freq_mhz"] for p in d["points"]] == [h / 1e6 for h in ORIN_TABLE_HZ]
    for p in [*d["points"], d["maxn"]]:
        assert {"freq_mhz", "time_s", "avg_power_w", "energy_j", "gpu_util_pct"} <= p.keys()
    assert d["maxn"]["freq_mhz"] == "maxn"
    assert d["optimal_freq_mhz"] == min(d["points"], key=lambda p: p["energy_j"])["freq_mhz"]


def test_simulate_model_config_file(cli, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 3, "hidden_size": 96,
                               "num_attention_heads": 2, "intermediate_size": 384, "vocab_size": 1000}))
    d = json.loads(cli("simulate", "--model-config", str(cfg), "--seq-len", "16", "--json").output)
    assert d["num_layers"] == 3 and d["hidden_size"] == 96


def test_simulate_text(cli):
    r = cli("simulate", "bert-tiny", "--seq-len", "16")
    assert "optimal" in r.output and "SIMULATED" in r.output and "maxn@" in r.output


def test_run_on_fake_jetson_pins_and_restores(cli, orin, tmp_path):
    probe = tmp_path / "seen"
    r = cli("run", "--freq", "612", "--json", "--", "sh", "-c", f"cat {orin.node}/min_freq > {probe}; exit 3")
    assert r.exit_code == 3
    assert probe.read_text().strip() == "612000000"
    assert orin.range_hz == (ORIN_TABLE_HZ[0], ORIN_TABLE_HZ[-1])
    report = json.loads(r.stdout)
    assert report["returncode"] == 3 and report["simulated"] is False and report["energy_j"] > 0


def test_run_sim_reports_simulated(cli):
    r = cli("run", "--freq", "maxn", "--device", "sim", "--json", "--", "true")
    assert r.exit_code == 0 and json.loads(r.stdout)["simulated"] is True


def test_run_passes_arguments_verbatim_no_shell(cli, tmp_path):
    target = tmp_path / "out"
    r = cli("run", "--freq", "816", "--device", "sim", "--", "python", "-c",
            "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(target), "$(rm -rf /); `id`")
    assert r.exit_code == 0 and target.read_text() == "$(rm -rf /); `id`"


@pytest.mark.parametrize("args, message", [
    (["run", "--freq", "700", "--device", "sim", "--", "true"], "valid frequencies: 306"),
    (["run", "--freq", "816", "--device", "sim", "--", "no-such-program-xyz"], "command not found"),
    (["simulate", "bert-huge", "--seq-len", "8"], "unknown model 'bert-huge'"),
    (["simulate", "--model-config", "/nonexistent/config.json", "--seq-len", "8"], "does not exist"),
    (["devices", "--device", "jetson"], "no Jetson GPU devfreq node"),
])
def test_errors_are_one_line_exit_2_no_traceback(args, message):
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("device:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr


def test_restore_with_nothing_left(cli):
    assert "nothing to restore" in cli("restore").output
