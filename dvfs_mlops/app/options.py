"""The command line's option groups: related click options that reach a command as ONE typed record.

`OptionGroup` adds its options to a command and hands it their values built into one record (`DeviceChoice`, `PeftSpec`,
`SweepRequest`, ...); a group may hold another group, whose record is built first. Builders only translate the command
line (an empty string is an unset option, as the MLproject passes them); defaults and checks live in the records and the
app layer. Nothing heavy is imported until a command runs.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from dvfs_mlops.app.clockd_command import ClockdOptions
from dvfs_mlops.app.devices import TRACE_HELP, DeviceChoice
from dvfs_mlops.app.finetune_command import FinetuneJobRequest
from dvfs_mlops.app.sweep_command import SweepWorker
from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE
from dvfs_mlops.job.workloads.zoo import PRESETS as MODEL_PRESETS
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT

F = TypeVar("F", bound=Callable[..., Any])


class OptionGroup:
    """Click options (or nested groups) that a command receives as one record, `build(**values)`, named `dest`.

    Attributes:
        dest: the keyword argument the command receives the record as.
        build: makes the record from the options' values, keyed by their click parameter names (and a nested
            group's record, keyed by its `dest`).
        options: click.option/click.argument decorators and nested `OptionGroup`s, in --help order.
    """

    def __init__(self, dest: str, build: Callable[..., Any], options: Sequence[Any]) -> None:
        self.dest, self.build, self.options = dest, build, list(options)
        self._names = [None if isinstance(o, OptionGroup) else _param_name(o) for o in self.options]

    def decorators(self) -> list[Callable[[Any], Any]]:
        """Every click decorator of the group, nested groups' inlined, in --help order."""
        return [d for o in self.options for d in (o.decorators() if isinstance(o, OptionGroup) else [o])]

    def collect(self, kwargs: dict[str, Any]) -> Any:
        """Pop the group's values from a command's keyword arguments and build the record."""
        values = {}
        for option, name in zip(self.options, self._names):
            if isinstance(option, OptionGroup):
                values[option.dest] = option.collect(kwargs)
            else:
                values[name] = kwargs.pop(name)
        return self.build(**values)

    def __call__(self, command: F) -> F:
        """Decorate a command: add the options; the command receives the record as `dest` instead of them."""

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[self.dest] = self.collect(kwargs)
            return command(*args, **kwargs)

        decorated: Any = wrapper
        for decorator in reversed(self.decorators()):
            decorated = decorator(decorated)
        return decorated


def option_group(dest: str, build: Callable[..., Any], *options: Any) -> OptionGroup:
    """A decorator that adds `options` to a command and passes it `dest=build(**their values)` instead (`OptionGroup`)."""
    return OptionGroup(dest, build, options)


def lazy(module: str, name: str) -> Callable[..., Any]:
    """A builder of the record `module.name` that imports its module only when a command runs (--help stays light)."""
    return lambda **fields: getattr(importlib.import_module(module), name)(**fields)


def _param_name(decorator: Callable[[Any], Any]) -> str:
    """The parameter name a click.option/click.argument decorator gives its value (applied to a throwaway function)."""
    probe = decorator(lambda: None)
    return str(probe.__click_params__[0].name)


class Count(click.IntRange):
    """A whole-number option: INTEGER in --help; a bad value is one line naming it ("--steps must be a whole number")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                int(value.strip())
            except ValueError:
                name = param.opts[0] if param is not None and param.opts else "value"
                raise click.UsageError(f"{name} must be a whole number, got {value!r}", ctx) from None
        return super().convert(value, param, ctx)


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (messages and links go to stderr).")
SEED_OPTION = click.option("--seed", default=0, show_default=True, type=Count(), help="Random seed (data, model init, sampling): same seed, same run.")
PRECISION_OPTION = click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "fp16"]),
                                help="Training precision (autocast; fp16 with a gradient scaler). Recorded on every run.")
BATCH_SIZE_OPTION = click.option("--batch-size", default=16, show_default=True, type=Count(min=1), help="Examples per training step.")
DATA_SOURCE_OPTION = click.option("--data-source", default="synthetic", show_default=True, type=click.Choice(["synthetic", "tsv", "hub"]),
                                  help="Built-in synthetic GLUE-like tasks, GLUE TSV files (--data-dir), or the hub (online).")
OBSERVE_OPTION = click.option("--observe", is_flag=True, help="Meter only: write no clock, take no lock; runs are tagged dvfs.observe=true.")
MODEL_CONFIG_HELP = "A transformers config.json (or folder) instead of a preset."
WARMUP_OPTION = click.option("--warmup-steps", default=None, type=Count(min=0), help="First steps metered apart (3 on boards, 0 on the twin).")


# --peft and the LoRA options, on every command that trains (sweep, finetune): a PeftSpec.
peft_options = option_group(
    "peft", lazy("dvfs_mlops.job.workloads.adapters", "peft_spec"),
    click.option("--peft", "method", default="full", show_default=True, type=click.Choice(["full", "lora"]),
                 help="full: every weight trains; lora: frozen base, adapters and the task head train (+lora-r8a16 in its name)."),
    click.option("--lora-r", "r", default=None, type=Count(min=1), help="LoRA rank (default 8)."),
    click.option("--lora-alpha", "alpha", default=None, type=Count(min=1), help="LoRA scale alpha (default 16)."),
    click.option("--lora-targets", "targets", default="", help="Comma-separated modules LoRA adapts (default: peft's table, e.g. q_proj,v_proj)."),
)

_DEVICE_OPTIONS = {
    "backend": click.option("--device", "backend", default="auto", show_default=True,
                            type=click.Choice(["auto", "jetson", "nvml", "sim", "replay"]), help="Device backend (replay: --trace's grid)."),
    "sample_hz": click.option("--sample-hz", default=50.0, show_default=True, type=click.FloatRange(min=0.1),
                              help="Power sampling rate of the meter (jetson, nvml)."),
    "gpu_index": click.option("--gpu-index", default=0, show_default=True, type=click.IntRange(min=0),
                              help="nvml: which GPU, by NVML index (nvidia-smi's order; the backend finds its CUDA device by UUID)."),
    "assume_unlocked": click.option("--assume-unlocked", is_flag=True, help=(
        "nvml: pin although NVML cannot tell whether the clocks are already locked (the restore resets locked clocks).")),
    "torch_device": click.option("--torch-device", default="", metavar="DEV",
                                 help="Train on DEV (cpu, cuda:1 ...), not the backend's GPU (tests: an idle pinned GPU saves nothing)."),
    "twin_profile": click.option("--twin-profile", default=None, metavar="NAME",
                                 help=f"sim: the twin's board profile: {', '.join(BUILTIN_PROFILES)} (default {DEFAULT_PROFILE})."),
    "twin_params": click.option("--twin-params", default=None, type=click.Path(exists=True, dir_okay=False), metavar="FILE.yaml",
                                help="sim: a YAML of twin constants over --twin-profile's (e.g. written by `dvfs-mlops twin fit`)."),
    "device_id": click.option("--device-id", default="", metavar="ID", help=(
        "Which board this is, tagged dvfs.device_id (default: the Jetson's serial, the GPU's UUID, sim@HOST); not in a sweep's id.")),
    "trace": click.option("--trace", default=None, metavar="FILE.csv", help=TRACE_HELP),
}


def device_options(*names: str) -> OptionGroup:
    """The device options (all of them, or those `names` picks, in `_DEVICE_OPTIONS` order) as one `DeviceChoice`, `device`."""
    chosen = [option for name, option in _DEVICE_OPTIONS.items() if not names or name in names]
    return option_group("device", DeviceChoice, *chosen)


knob_options = option_group("knobs", lazy("dvfs_mlops.app.run", "RunKnobs"),  # beside --freq, in MHz like it: one RunKnobs
    click.option("--cpu-freq", "cpu_mhz", type=float, metavar="MHZ", help="Also pin every CPU cluster at this clock (jetson)."),
    click.option("--emc-freq", "emc_mhz", type=float, metavar="MHZ", help="Also pin the memory clock (jetson EMC, nvml memory)."))
simulate_options = option_group(
    "request", lazy("dvfs_mlops.app.simulate", "SimulateRequest"),
    click.argument("model", required=False),
    click.option("--model-config", type=click.Path(), help=MODEL_CONFIG_HELP),
    click.option("--seq-len", type=Count(min=1), default=None, help="Padded sequence length of a batch (required unless --task)."),
    click.option("--task", default="", help="Trace this task's head (a GLUE classifier, instruct's LM head); its mean length by default."),
    BATCH_SIZE_OPTION,
    PRECISION_OPTION,
)


def _sweep_request(data_dir: str, sweep_id: str, **fields: Any) -> Any:
    from dvfs_mlops.mlops.sweep import SweepRequest

    return SweepRequest(data_dir=data_dir or None, sweep_id=sweep_id or None, **fields)


sweep_options = option_group(
    "request", _sweep_request,
    click.option("--preset", default="quick", show_default=True, help="smoke | quick | paper."),
    click.option("--models", default="", help="Comma-separated models (default: the preset's): presets, config.json files, hub ORG/NAME."),
    click.option("--tasks", default="", help="Comma-separated tasks (default: the preset's): GLUE tasks, or instruct (decoders)."),
    click.option("--freqs", default="", help="Comma-separated clocks in MHz (maxn is always added); default: the preset's or the whole table."),
    click.option("--steps", default=None, type=Count(min=0), help="Training steps per point (default: the preset's); 0 = profile only (sim)."),
    click.option("--profile-steps", default=None, type=Count(min=1), help="Steps charged per point when --steps 0 (default: the preset's)."),
    BATCH_SIZE_OPTION,
    click.option("--repeats", default=None, type=Count(min=1), help="Repeats per point (default: the preset's); each in its own clock order."),
    DATA_SOURCE_OPTION,
    click.option("--data-dir", default="", help="A GLUE TSV folder (instruct: instruct/train.jsonl, dev.jsonl); implies --data-source tsv."),
    SEED_OPTION,
    click.option("--experiment", default=SWEEP_EXPERIMENT, show_default=True, help="MLflow experiment the sweep's runs go to."),
    click.option("--sweep-id", default="", help="Resume/extend this sweep id (default: a hash of the sweep's definition)."),
    click.option("--train-size", default=None, type=Count(min=1), help="Synthetic training examples per task (default: the preset's)."),
    click.option("--dev-size", default=None, type=Count(min=1), help="Synthetic dev examples per task (default: the preset's)."),
    click.option("--replay/--no-replay", default=True, show_default=True, help="Sim: train once per workload and replay its steps at every clock."),
    WARMUP_OPTION,
    PRECISION_OPTION,
    peft_options,
    click.option("--strategy", default="grid", show_default=True, type=click.Choice(["grid", "adaptive"]),
                 help="grid: every clock; adaptive: maxn and at most 4 clocks per workload chosen by the curve model (the rest predicted)."),
)

sweep_worker_options = option_group(
    "worker", SweepWorker,
    click.option("--settle-s", default=0.0, show_default=True, type=click.FloatRange(min=0), help="Hardware: idle this long before each point."),
    click.option("--observe", is_flag=True, hidden=True, help="Refused: a sweep pins every clock (meter a job with finetune/run --observe)."),
    click.option("--claims", "claims_uri", default="", metavar="URI",
                 help="Where workers of one sweep claim its points: postgresql://..., file:///PATH, tracking (an http(s) server's "
                      "default) or none (default $DVFS_CLAIMS_URI, else what the tracking store allows; README 'A fleet')."),
    click.option("--claim-ttl-s", default=120.0, show_default=True, type=click.FloatRange(min=1), help="A dead worker's claim is taken after this."),
)


train_options = option_group(
    "request", lazy("dvfs_mlops.mlops.train", "TrainRequest"),
    click.option("--sweep-id", default="", help="The sweep to learn from, or several as a,b,... (one dataset; default: the latest in --experiment)."),
    click.option("--sweeps-filter", default="", metavar="FILTER",
                 help="Learn from every sweep whose FINISHED points match this MLflow filter, e.g. \"params.device_profile = 'sim-orin'\"."),
    click.option("--mix-profiles", is_flag=True, help="Allow sweeps of different device profiles in one governor (refused by default)."),
    click.option("--experiment", default=SWEEP_EXPERIMENT, show_default=True, help="Where the sweep's runs are."),
    click.option("--objective", default="energy", show_default=True, help="energy | edp | max-slowdown:X (least energy within X x the fastest)."),
    click.option("--trials", default=60, show_default=True, type=Count(min=1), help="Optuna trials of the selection study (each one a full inner CV)."),
    SEED_OPTION,
    click.option("--register/--no-register", default=True, show_default=True, help="Register the model as a new version."),
    click.option("--storage", default="", help="Optuna storage URL (default: optuna.db beside a SQLite tracking DB)."),
    click.option("--study-name", default="", help="Join this Optuna study (several processes may share one); default: a fresh study per run."),
    click.option("--cv-split", default="auto", show_default=True, type=click.Choice(["auto", "workload", "task", "model"]),
                 help="Groups held out (auto: task with 3+ tasks, else workload)."),
    click.option("--outer-trials", default=None, type=Count(min=1), help="Trials of each outer fold's study in nested CV (default: --trials)."),
)

finetune_job_options = option_group(
    "job", FinetuneJobRequest,
    click.option("--model", default="", help=f"A model preset ({', '.join(MODEL_PRESETS)}), a config.json or folder, or a hub ORG/NAME."),
    click.option("--model-config", default="", help=MODEL_CONFIG_HELP),
    click.option("--task", required=True, help="A GLUE task (sst2, qnli, mrpc, qqp, rte, cola, stsb, mnli, wnli) or instruct (decoders)."),
    click.option("--pretrained", default="", help="Real weights and tokenizer: a hub name (online) or a local folder."),
    click.option("--steps", default=60, show_default=True, type=Count(min=1), help="Training steps."),
    click.option("--epochs", default=None, type=click.FloatRange(min=0, min_open=True), help="Overrides --steps."),
    BATCH_SIZE_OPTION,
    click.option("--learning-rate", default=None, type=float, help="Default 1e-3 from scratch, 5e-5 with --pretrained."),
    PRECISION_OPTION,
    peft_options,
    DATA_SOURCE_OPTION,
    click.option("--data-dir", default="", help="A GLUE TSV folder (instruct: instruct/train.jsonl, dev.jsonl); implies --data-source tsv."),
    click.option("--train-size", default=2048, show_default=True, type=Count(min=1), help="Synthetic training examples."),
    SEED_OPTION,
    WARMUP_OPTION,
)


def _launch_options(governor_uri: str, no_save_model: bool, **fields: Any) -> Any:
    from dvfs_mlops.app.finetune import LaunchOptions

    return LaunchOptions(governor_uri=governor_uri or None, save_model=not no_save_model, **fields)


launch_options = option_group(
    "options", _launch_options,
    click.option("--governor", "governor_uri", default="", help="A models:/ URI (default models:/dvfs-governor@production)."),
    click.option("--probe-steps", default=5, show_default=True, type=Count(min=0), help="Steps at maxn to measure GPU load; 0 = the twin's."),
    OBSERVE_OPTION,
    click.option("--strict", is_flag=True, help="Refuse a governor trained for another device profile."),
    click.option("--dry-run", is_flag=True, help="Stop after the decision (nothing is trained or logged)."),
    click.option("--no-save-model", is_flag=True, help="Do not log the fine-tuned model as an artifact."),
    click.option("--refine", default=None, type=Count(min=0), metavar="N",
                 help="N steps probing clocks near the governor's, then the curve model's optimum; 0 = off (default 30; twin 0)."),
    click.option("--allow-other-board", is_flag=True, help="Let another board family's governor decide (recorded); else such a board refines."),
)


def _curve_fit_request(file: str | None, **fields: Any) -> Any:
    from dvfs_mlops.app.curve_fit import CurveFitRequest

    return CurveFitRequest(file=file or "", **fields)


curve_fit_options = option_group(
    "request", _curve_fit_request,
    click.argument("file", required=False, type=click.Path(dir_okay=False)),
    click.option("--clocks", default="", help="Comma-separated clocks (MHz) to fit on (default: every row)."),
    click.option("--sweep-id", default="", help="Read the points from this MLflow sweep instead of FILE."),
    click.option("--workload", default="", help="With --sweep-id: the workload, MODEL/TASK."),
    click.option("--experiment", default=SWEEP_EXPERIMENT, show_default=True, help="With --sweep-id: where the sweep's runs are."),
    click.option("--voltage-shape", default=None, type=click.FloatRange(min=0), help="r in V(f) ~ 1 + r (f/f_max)^2 (default: the board's)."),
)


def _calibration_request(no_promote: bool, **fields: Any) -> Any:
    from dvfs_mlops.mlops.calibration import CalibrationRequest

    return CalibrationRequest(promote=not no_promote, **fields)


calibrate_options = option_group(
    "request", _calibration_request,
    click.option("--source", default="", metavar="V", help="The version to calibrate from (default: the richest other family's production)."),
    click.option("--preset", default="quick", show_default=True, help="The sweep preset whose workloads are the candidates."),
    click.option("--steps", default=None, type=Count(min=0), help="Training steps per point (default the preset's; twin: 0 profiles)."),
    BATCH_SIZE_OPTION,
    click.option("--experiment", default=SWEEP_EXPERIMENT, show_default=True, help="Where the calibration sweeps' runs go."),
    click.option("--no-promote", is_flag=True, help="Register the calibrated version but do not promote it."),
)


clockd_options = option_group("options", ClockdOptions.from_cli, click.argument("device", default=""),
    click.option("--socket", default="", help="The service's socket (default $DVFS_CLOCKD_SOCKET, else /run/dvfs-mlops/clockd.sock)."),
    click.option("--group", default="dvfs", show_default=True, help="The group whose members may pin clocks through it."),
    click.option("--unit-dir", default="", help="Where install writes the systemd unit (default /etc/systemd/system)."),
    click.option("--max-lease", default="24h", show_default=True, help="serve, install: the longest a pin lasts, renewals included."))
