from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from testkit.fakes.sysfs import ORIN_TABLE_HZ
from tests.conftest import run_cli


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
    r = run_cli(*args, process=True)  # every stderr line counts: a warning or a logged line would show here
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("device:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr


def test_restore_with_nothing_left(cli):
    assert "nothing to restore" in cli("restore").output


def _commands(group, path=("dvfs-mlops",)):
    """(path, command) for every command of the click group, sub-groups included."""
    import click

    for name, cmd in sorted(group.commands.items()):
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


COUNT_WORDS = ("steps", "trials", "repeats", "seed", "size", "index", "len", "epochs")


def test_every_option_has_help_and_counts_are_not_strings():
    import click

    missing, stringly = [], []
    for path, cmd in _commands(main):
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            where = f"{' '.join(path)} {p.opts[0]}"
            if not (p.help or "").strip():
                missing.append(where)
            if any(w in p.name for w in COUNT_WORDS) and isinstance(p.type, click.types.StringParamType):
                stringly.append(where)
    assert missing == [], f"options without help: {missing}"
    assert stringly == [], f"count options typed as strings: {stringly}"
    names = [" ".join(path) for path, _ in _commands(main)]
    assert {"dvfs-mlops sweep", "dvfs-mlops train", "dvfs-mlops finetune", "dvfs-mlops registry promote"} <= set(names)


def test_help_shows_integer_types_and_finetune_lists_the_model_presets(cli):
    from dvfs_mlops.job.workloads.zoo import PRESETS

    sweep_help = cli("sweep", "--help").output
    for opt in ("--steps", "--profile-steps", "--repeats", "--train-size", "--dev-size", "--seed", "--batch-size"):
        line = next(l for l in sweep_help.splitlines() if l.strip().startswith(opt + " "))
        assert "INTEGER" in line and "TEXT" not in line, line
    import re

    finetune_help = re.sub(r"-\s+", "-", " ".join(cli("finetune", "--help").output.split()))  # help wraps at hyphens
    assert all(name in finetune_help for name in PRESETS) and "simulate --help" not in finetune_help


@pytest.mark.parametrize("args, message", [
    (["sweep", "--steps", "x"], "--steps must be a whole number, got 'x'"),
    (["sweep", "--repeats", "0"], "Invalid value for '--repeats'"),
    (["train", "--trials", "many"], "--trials must be a whole number"),
    (["finetune", "--model", "bert-tiny", "--task", "sst2", "--probe-steps", "1.5"], "--probe-steps must be a whole number"),
])
def test_bad_counts_are_one_line_usage_errors(args, message):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_option_group_hands_the_command_one_record_built_from_its_options_and_nested_groups():
    import dataclasses

    import click

    from dvfs_mlops.app.options import option_group

    @dataclasses.dataclass(frozen=True)
    class Inner:
        depth: int

    @dataclasses.dataclass(frozen=True)
    class Outer:
        name: str
        inner: Inner

    inner = option_group("inner", Inner, click.option("--depth", default=1, type=int, help="Depth."))
    outer = option_group("outer", Outer, click.option("--name", default="x", help="Name."), inner)
    seen = {}

    @click.command()
    @outer
    @click.option("--plain", is_flag=True, help="Not in a group.")
    def cmd(outer: Outer, plain: bool) -> None:
        """A command."""
        seen.update(outer=outer, plain=plain)

    assert [p.name for p in cmd.params] == ["name", "depth", "plain"] and cmd.help == "A command."
    r = CliRunner().invoke(cmd, ["--depth", "3", "--plain"])
    assert r.exit_code == 0, r.output
    assert seen == {"outer": Outer("x", Inner(3)), "plain": True}
    assert "--depth INTEGER" in CliRunner().invoke(cmd, ["--help"]).output


def test_device_options_add_only_the_options_named():
    devices, run = main.commands["devices"], main.commands["run"]
    assert [p.name for p in devices.params] == ["backend", "gpu_index", "trace", "as_json"]
    assert [p.name for p in run.params if p.name in ("backend", "sample_hz", "gpu_index", "twin_profile", "twin_params",
                                                      "device_id", "torch_device", "trace")] == \
        ["backend", "sample_hz", "gpu_index", "twin_profile", "twin_params", "device_id"]


def test_sweep_and_finetune_options_build_their_requests(monkeypatch):
    """The records each command receives: empty strings (as the MLproject passes them) are unset options, the LoRA
    options become the request's PeftSpec, the device options one DeviceChoice."""
    from dvfs_mlops.app import finetune_command, sweep_command
    from dvfs_mlops.app.devices import DeviceChoice
    from dvfs_mlops.job.workloads.adapters import peft_spec
    from dvfs_mlops.mlops.launch import LaunchOptions
    from dvfs_mlops.mlops.sweep import SweepRequest

    seen = {}

    def fake_sweep(request, device, worker, say, with_best=False):
        seen.update(request=request, device=device, worker=worker)
        return sweep_command.SweepReport(None, True, [])

    monkeypatch.setattr(sweep_command, "run_sweep_command", fake_sweep)
    monkeypatch.setattr(sweep_command.SweepReport, "lines", lambda self: ["ran"])
    r = CliRunner().invoke(main, ["sweep", "--preset", "smoke", "--models", "bert-tiny", "--data-dir", "", "--sweep-id", "",
                                  "--peft", "lora", "--lora-r", "4", "--device", "sim", "--twin-profile", "sim-orin-measured",
                                  "--claims", "none", "--settle-s", "2"])
    assert r.exit_code == 0 and r.stdout == "ran\n", r.output
    assert seen["request"] == SweepRequest("smoke", models="bert-tiny", data_dir=None, sweep_id=None, peft=peft_spec("lora", 4))
    assert seen["device"] == DeviceChoice(backend="sim", twin_profile="sim-orin-measured")
    assert seen["worker"] == sweep_command.SweepWorker(settle_s=2.0, claims_uri="none")

    def fake_finetune(job, device, options, quiet, say):
        seen.update(job=job, device=device, options=options, quiet=quiet)
        return finetune_command.FinetuneReport({"dry": True}, [])

    monkeypatch.setattr(finetune_command, "finetune", fake_finetune)
    r = CliRunner().invoke(main, ["finetune", "--model", "bert-tiny", "--task", "rte", "--governor", "", "--no-save-model",
                                  "--probe-steps", "0", "--gpu-index", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"dry": True}, r.output
    assert seen["job"] == finetune_command.FinetuneJobRequest(model="bert-tiny", task="rte")
    assert seen["options"] == LaunchOptions(governor_uri=None, probe_steps=0, save_model=False) and seen["quiet"] is True
    assert seen["device"] == DeviceChoice(gpu_index=1)
