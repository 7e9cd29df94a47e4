"""The MLproject is the command line, not a second one: its entry points are the CLI's commands, each parameter one of the
command's options with the same default (unset: the record's), every option a user of `mlflow run` needs is there, and
what `mlflow run . -e ENTRY -P k=v` runs (rendered by MLflow's own MLproject code, split by bash as `mlflow run` runs it)
builds the same records as the CLI given the same options."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from tests.conftest import REPO

ENTRIES = {"sweep": ("sweep",), "train": ("train",), "finetune": ("finetune",), "evaluate": ("evaluate",),
           "calibrate": ("calibrate",), "promote": ("registry", "promote")}
# The command line's options a user of `mlflow run` does not get, and why.
NOT_IN_MLPROJECT = {
    "as_json": "the run is the result; --json prints it for scripts",
    "experiment@sweep": "under `mlflow run` a sweep's runs go to the run's own experiment (--experiment-name)",
    "observe@sweep": "refused by the command (hidden)",
    "dry_run@finetune": "a dry run decides only: it logs no run, so it has no business under `mlflow run`",
}


def _entry_points() -> dict:
    from mlflow.projects._project_spec import load_project

    return {name: load_project(str(REPO)).get_entry_point(name) for name in ENTRIES}


def _command(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    return cmd


def _argv(entry: str, params: dict[str, str]) -> list[str]:
    """The command line `mlflow run . -e ENTRY -P k=v ...` runs, after the program name and the command's path."""
    cmd = _entry_points()[entry].compute_command(params, storage_dir=None)
    cmd = cmd.removeprefix("env -u MLFLOW_RUN_ID ")
    assert cmd.startswith("dvfs-mlops " + " ".join(ENTRIES[entry]) + " ")
    out = subprocess.run(["bash", "-c", 'printf "%s\\n" ' + cmd[len("dvfs-mlops "):]], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[len(ENTRIES[entry]):]


def _option(cmd: click.Command, param: str) -> click.Option | None:
    return next((p for p in cmd.params if isinstance(p, click.Option) and param.replace("_", "-") in
                 [o.lstrip("-") for o in [*p.opts, *p.secondary_opts]]), None)


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_parameter_is_an_option_of_the_command_with_the_same_default(entry):
    """A parameter's default is "" (unset: the option passes nothing and the record's default applies) and its option
    exists on the command; a required option (finetune's --task) has no default anywhere."""
    from dvfs_mlops.app.options import RecordOption

    cmd = _command(ENTRIES[entry])
    for name, param in _entry_points()[entry].parameters.items():
        opt = _option(cmd, name)
        if opt is None:  # an argument (promote's VERSION)
            assert name in [p.name for p in cmd.params if isinstance(p, click.Argument)], f"{entry}: -P {name} is no option of the command"
            continue
        assert param.default in ("", None), f"{entry}: -P {name} has a default of its own ({param.default!r}): the record's is the one"
        if param.default is None:
            assert opt.required, f"{entry}: -P {name} is required, --{name} is not"
        else:
            unset = opt.default in ("", False, None) or (opt.is_flag and opt.default is not True)  # a flag's own: off
            assert isinstance(opt, RecordOption) or opt.required or unset, \
                f"{entry}: --{name} has a default of its own ({opt.default!r}) where the MLproject passes nothing"


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_option_a_user_of_mlflow_run_needs_is_a_parameter(entry):
    cmd, params = _command(ENTRIES[entry]), _entry_points()[entry].parameters
    missing = []
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.name in NOT_IN_MLPROJECT or f"{p.name}@{entry}" in NOT_IN_MLPROJECT:
            continue
        names = {o.lstrip("-").replace("-", "_") for o in p.opts}
        if not names & set(params):
            missing.append(p.opts[0])
    assert not missing, f"{entry}: options with no MLproject parameter (add them, or say why in NOT_IN_MLPROJECT): {missing}"


class _Captured(Exception):
    pass


def _records(path: tuple[str, ...], argv: list[str], monkeypatch) -> dict:
    """The records the command hands its app function for `argv` (the function itself is not run)."""
    from dvfs_mlops.app import calibrate, finetune_command, governor_commands, sweep_command

    seen: dict = {}

    def capture(*args, **kwargs):
        seen.update({f"arg{i}": a for i, a in enumerate(args)}, **{k: v for k, v in kwargs.items() if k != "say"})
        raise _Captured

    for module, name in ((sweep_command, "run_sweep_command"), (governor_commands, "train"), (finetune_command, "finetune"),
                         (governor_commands, "evaluate"), (calibrate, "calibrate"), (governor_commands, "promote")):
        monkeypatch.setattr(module, name, capture)
    r = CliRunner().invoke(main, [*path, *argv])
    assert isinstance(r.exception, _Captured), r.output
    return seen


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e != "promote"])
def test_with_every_parameter_unset_each_record_has_its_own_defaults(entry, monkeypatch):
    """`mlflow run . -e ENTRY` with nothing set builds exactly what the bare command builds (finetune: with a task)."""
    extra = {"task": "rte"} if entry == "finetune" else {}
    from_mlproject = _records(ENTRIES[entry], _argv(entry, extra), monkeypatch)
    bare = _records(ENTRIES[entry], ["--task", "rte"] if extra else [], monkeypatch)
    assert from_mlproject == bare
    defaults = {"sweep": "SweepRequest", "train": "TrainRequest", "evaluate": "EvaluateRequest", "calibrate": "CalibrationRequest"}
    if entry in defaults:
        record = bare["arg0"]
        assert record == type(record)(), f"{entry}: an unset option is not the record's default"


@pytest.mark.parametrize("entry, params, expected", [
    ("sweep", {"preset": "smoke", "steps": "2", "repeats": "3", "models": "bert-tiny,pythia-14m", "freqs": "510",
               "data_dir": "/data/my glue", "train_once": "false", "strategy": "adaptive", "warmup_steps": "1", "train_size": "64"},
     {"preset": "smoke", "steps": 2, "repeats": 3, "models": "bert-tiny,pythia-14m", "freqs": "510", "data_dir": "/data/my glue",
      "train_once": False, "strategy": "adaptive", "warmup_steps": 1, "train_size": 64, "batch_size": 16}),
    ("sweep", {"peft": "lora", "lora_r": "16"}, {"peft": ("lora", 16, 16)}),
    ("sweep", {"knob": "attn_implementation=eager"}, {"knobs": ("attn_implementation=eager",)}),
    ("train", {"sweep_id": "sweep-abc", "trials": "5", "seed": "7", "register": "false", "cv_split": "task"},
     {"sweep_id": "sweep-abc", "trials": 5, "seed": 7, "register": False, "cv_split": "task", "objective": "energy"}),
    ("evaluate", {"split": "train", "objective": "edp"}, {"split": "train", "objective": "edp", "policies": "production,ffg,paper-mlg,maxn,oracle"}),
    ("calibrate", {"promote": "true", "steps": "0"}, {"promote": True, "steps": 0, "preset": "quick"}),
    ("calibrate", {"promote": "false"}, {"promote": False}),
])
def test_set_parameters_arrive_typed_in_the_records(entry, params, expected, monkeypatch):
    record = _records(ENTRIES[entry], _argv(entry, params), monkeypatch)["arg0"]
    got = {k: getattr(record, k) for k in expected}
    if "peft" in got:
        got["peft"] = (got["peft"].method, got["peft"].r, got["peft"].alpha)
    assert got == expected


def test_finetune_parameters_reach_the_job_the_launcher_and_the_device(monkeypatch):
    params = {"model": "bert-tiny", "task": "rte", "steps": "3", "probe_steps": "0", "governor": "models:/dvfs-governor/2",
              "save_model": "false", "refine": "0", "device": "sim", "twin_profile": "sim-orin-nano-8gb", "seed": ""}
    seen = _records(("finetune",), _argv("finetune", params), monkeypatch)
    job, device, options = seen["arg0"], seen["arg1"], seen["arg2"]
    assert (job.model, job.task, job.steps, job.seed, job.train_size) == ("bert-tiny", "rte", 3, 0, 2048)
    assert (options.governor_uri, options.probe_steps, options.save_model, options.refine) == ("models:/dvfs-governor/2", 0, False, 0)
    assert (device.backend, device.twin_profile, device.sample_hz) == ("sim", "sim-orin-nano-8gb", 50.0)


def test_mlflow_run_finetune_without_a_task_refuses_as_the_cli_does(tmp_path, empty_store):
    """`mlflow run . -e finetune` with no task: the command's own one-line refusal, before anything runs."""
    cli = CliRunner().invoke(main, ["finetune", "--model", "bert-tiny"], prog_name="dvfs-mlops")
    assert cli.exit_code == 2
    refusal = cli.stderr.strip()
    assert refusal.startswith("Error: Missing option '--task'")
    env = {**os.environ, "MLFLOW_TRACKING_URI": empty_store, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["mlflow", "run", str(REPO), "-e", "finetune", "--env-manager", "local", "-P", "model=bert-tiny"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode != 0 and refusal in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr.split("=== Running command")[-1].split("ExecutionException")[0]


def test_the_records_defaults_are_the_ones_the_help_shows():
    """--help shows each unset option's default as its record has it (one place for each default)."""
    from dvfs_mlops.mlops.sweep import SweepRequest

    out = " ".join(CliRunner().invoke(main, ["sweep", "--help"]).output.split())
    for field in ("preset", "batch_size", "data_source", "precision", "strategy"):
        value = getattr(SweepRequest(), field)
        assert f"[default: {value}" in out.split(f"--{field.replace('_', '-')} ", 1)[1].split(" --", 1)[0], field


def test_the_calibrate_entry_runs_without_mlflows_run_id():
    """A calibration's sweeps make their own parent runs, and its version's run is in dvfs-governor: MLflow's run id is
    not passed on (the sweeps would not adopt it either: `RunOptions.adopt_run`)."""
    assert _entry_points()["calibrate"].compute_command({}, storage_dir=None).startswith("env -u MLFLOW_RUN_ID dvfs-mlops calibrate ")
