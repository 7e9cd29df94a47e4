"""The command line's option groups: related click options that reach a command as ONE typed record (`OptionGroup`).

Defaults live in the records: an option declared with `option` passes nothing when unset (nor does the empty string the
MLproject passes for an unset parameter), so the record's default applies, and --help shows it (`RecordOption`).
Checks live in the records and the app layer. Nothing heavy is imported until a command runs (or --help shows a default).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from dvfs_mlops.app.clockd_command import ClockdOptions
from dvfs_mlops.app.devices import TRACE_HELP, DeviceChoice
from dvfs_mlops.app.finetune_command import FinetuneJobRequest
from dvfs_mlops.app.sweep_command import STRATEGY_HELP, TUNED_HELP, SweepWorker
from dvfs_mlops.hw.twin.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE
from dvfs_mlops.job.workloads.zoo import PRESETS as MODEL_PRESETS
from dvfs_mlops.mlops.fields import KNOBS

F = TypeVar("F", bound=Callable[..., Any])


class RecordOption(click.Option):
    """An option whose default is its record's: unset (or given as ''), it passes None; --help shows the record's default."""

    record_default: Callable[[], Any] | None = None

    def type_cast_value(self, ctx: click.Context, value: Any) -> Any:
        if self.multiple and isinstance(value, (list, tuple)):
            value = [v for v in value if v != ""]
        return None if value == "" else super().type_cast_value(ctx, value)

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        if not call and self.record_default is not None:  # --help
            return self.record_default()
        return super().get_default(ctx, call=call)


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """`click.option` whose value, unset, is the record's default (`RecordOption`; a flag too)."""
    return click.option(*decls, cls=RecordOption, default=None, **attrs)


def _build(module: str, name: str, **fields: Any) -> Any:
    return getattr(importlib.import_module(module), name)(**fields)


def lazy(module: str, name: str) -> Callable[..., Any]:
    """A builder of the record `module.name` that imports its module only when a command runs (--help stays light)."""
    return functools.partial(_build, module, name)


class OptionGroup:
    """Click options (or nested groups, in --help order) that a command receives as one record, `build(**values)`,
    as its keyword argument `dest`: the values keyed by their click parameter names (a nested group's record by its
    `dest`); an unset `option` is left out, so the default of `build`'s parameter of that name applies."""

    def __init__(self, dest: str, build: Callable[..., Any], options: Sequence[Any]) -> None:
        self.dest, self.build, self.options = dest, build, list(options)
        probes = [None if isinstance(o, OptionGroup) else o(lambda: None).__click_params__[0] for o in self.options]
        self._names = [None if p is None else str(p.name) for p in probes]
        self._unset = {str(p.name) for p in probes if isinstance(p, RecordOption)}

    def decorators(self) -> list[Callable[[Any], Any]]:  # every click decorator, nested groups' inlined, in --help order
        return [d for o in self.options for d in (o.decorators() if isinstance(o, OptionGroup) else [o])]

    def record_default(self, name: str) -> Any:
        """The record's default of the option `name` (None where it has none to show)."""
        b = self.build
        target = getattr(importlib.import_module(b.args[0]), b.args[1]) if isinstance(b, functools.partial) and b.func is _build else b
        p = inspect.signature(target).parameters.get(name)
        default = None if p is None or p.default is inspect.Parameter.empty else p.default
        return None if default == "" else default

    def collect(self, kwargs: dict[str, Any]) -> Any:
        """Pop the group's values from a command's keyword arguments and build the record (unset options left out)."""
        values = {}
        for option_, name in zip(self.options, self._names):
            if isinstance(option_, OptionGroup):
                values[option_.dest] = option_.collect(kwargs)
                continue
            value = kwargs.pop(str(name))
            if name not in self._unset or value not in (None, ""):
                values[str(name)] = value
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
        for param in decorated.__click_params__:
            if isinstance(param, RecordOption) and param.name in self._unset:
                param.record_default, param.show_default = functools.partial(self.record_default, param.name), True
        return decorated


def option_group(dest: str, build: Callable[..., Any], *options: Any) -> OptionGroup:
    """A decorator that adds `options` to a command and passes it `dest=build(**their values)` instead (`OptionGroup`)."""
    return OptionGroup(dest, build, options)


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
SEED_OPTION = option("--seed", type=Count(min=0), help="Random seed (data, model init, sampling): same seed, same run.")
PRECISION_OPTION = option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]),
                          help="Training precision (autocast; fp16 with a gradient scaler). Recorded on every run.")
BATCH_SIZE_OPTION = option("--batch-size", type=Count(min=1), help="Examples per training step.")
DATA_SOURCE_OPTION = option("--data-source", type=click.Choice(["synthetic", "tsv", "hub"]),
                            help="Built-in synthetic GLUE-like tasks, GLUE TSV files (--data-dir), or the hub (online).")
DATA_DIR_OPTION = option("--data-dir", help="A GLUE TSV folder (instruct: instruct/train.jsonl, dev.jsonl); implies --data-source tsv.")
OBSERVE_OPTION = option("--observe", is_flag=True, help="Meter only: write no clock, take no lock; runs are tagged dvfs.observe=true.")
EXPERIMENT_OPTION = option("--experiment", help="The MLflow experiment of the sweep's runs.")
SWEEP_ID_HELP = "The sweep to read (or several as a,b,...; default: the newest in --experiment that can serve, never a calibration's)."
MODEL_CONFIG_HELP = "A transformers config.json (or folder) instead of a preset."
WARMUP_OPTION = option("--warmup-steps", type=Count(min=0), help="First steps metered apart (3 on boards, 0 on the twin).")
KNOB_OPTION = option("--knob", "knobs", multiple=True, metavar="NAME=VALUE", help=(
    f"A setting of the job (not a clock: see --knobs), recorded on every run (repeat it, or comma-separate): {', '.join(k.name for k in KNOBS)}."))
KNOBS_OPTION = option("--knobs", "tuned", metavar="gpu[,cpu][,emc]", help=TUNED_HELP)


# --peft and the LoRA options, on every command that trains (sweep, finetune): a PeftSpec.
peft_options = option_group(
    "peft", lazy("dvfs_mlops.job.workloads.adapters", "peft_spec"),
    option("--peft", "method", type=click.Choice(["full", "lora"]), help="full: every weight trains; lora: frozen base, adapters and head train."),
    option("--lora-r", "r", type=Count(min=1), help="LoRA rank (default 8)."),
    option("--lora-alpha", "alpha", type=Count(min=1), help="LoRA scale alpha (default 16)."),
    option("--lora-targets", "targets", help="Comma-separated modules LoRA adapts (default: peft's table, e.g. q_proj,v_proj)."),
)

_DEVICE_OPTIONS = {
    "device": option("--device", "backend", type=click.Choice(["auto", "jetson", "nvml", "sim", "replay"]), help="Device backend (replay: --trace's grid)."),
    "sample_hz": option("--sample-hz", type=click.FloatRange(min=0.1), help="Power sampling rate of the meter (jetson, nvml)."),
    "gpu_index": option("--gpu-index", type=click.IntRange(min=0), help="nvml: which GPU, by NVML index (nvidia-smi's order)."),
    "assume_unlocked": option("--assume-unlocked", is_flag=True, help="nvml: pin although NVML cannot tell if clocks are locked already."),
    "torch_device": option("--torch-device", metavar="DEV", help="Train on DEV (cpu, cuda:1 ...), not the backend's GPU (tests)."),
    "twin_profile": option("--twin-profile", metavar="NAME", help=f"sim: the twin's profile: {', '.join(BUILTIN_PROFILES)} (default {DEFAULT_PROFILE})."),
    "twin_params": option("--twin-params", type=click.Path(exists=True, dir_okay=False), metavar="FILE.yaml", help="sim: twin constants (twin fit's YAML)."),
    "device_id": option("--device-id", metavar="ID", help="Which board this is, tagged dvfs.device_id (default: serial, UUID, sim@HOST)."),
    "trace": option("--trace", metavar="FILE.csv", help=TRACE_HELP),
    "above_mode_cap": option("--above-mode-cap", is_flag=True, help="jetson: allow a clock above the power mode's GPU, CPU or EMC cap (recorded)."),
}


def device_options(*names: str) -> OptionGroup:
    """The device options (all, or those `names` picks, in `_DEVICE_OPTIONS`' order) as one `DeviceChoice`, `device`."""
    chosen = [option_ for name, option_ in _DEVICE_OPTIONS.items() if not names or name in names]
    return option_group("device", DeviceChoice, *chosen)


knob_options = option_group("knobs", lazy("dvfs_mlops.app.run", "RunKnobs"),  # beside --freq, in MHz like it: one RunKnobs
    click.option("--cpu-freq", "cpu_mhz", type=float, metavar="MHZ", help="Also pin every CPU cluster at this clock (jetson, sim)."),
    click.option("--emc-freq", "emc_mhz", type=float, metavar="MHZ", help="Also pin the memory clock (jetson EMC, nvml memory, sim)."))
simulate_options = option_group(
    "request", lazy("dvfs_mlops.app.simulate", "SimulateRequest"),
    click.argument("model", required=False),
    option("--model-config", type=click.Path(), help=MODEL_CONFIG_HELP),
    option("--seq-len", type=Count(min=1), help="Padded sequence length of a batch (required unless --task)."),
    option("--task", help="Trace this task's head (a GLUE classifier, instruct's LM head); its mean length by default."),
    BATCH_SIZE_OPTION,
    PRECISION_OPTION,
)

sweep_options = option_group(
    "request", lazy("dvfs_mlops.mlops.sweep", "SweepRequest"),
    option("--preset", help="smoke | quick | paper."),
    option("--models", help="Comma-separated models (default: the preset's): presets, config.json files, hub ORG/NAME."),
    option("--tasks", help="Comma-separated tasks (default: the preset's): GLUE tasks, or instruct (decoders)."),
    option("--freqs", help="Comma-separated clocks in MHz (maxn is always added); default: the preset's or the whole table."),
    option("--steps", type=Count(min=0), help="Training steps per point (default: the preset's); 0 = profile only (sim)."),
    option("--profile-steps", type=Count(min=1), help="Steps charged per point when --steps 0 (default: the preset's)."),
    BATCH_SIZE_OPTION,
    option("--repeats", type=Count(min=1), help="Repeats per point (default: the preset's); each in its own clock order."),
    DATA_SOURCE_OPTION, DATA_DIR_OPTION, SEED_OPTION, EXPERIMENT_OPTION,
    option("--sweep-id", help="Resume/extend this sweep id (default: a hash of the sweep's definition)."),
    option("--train-size", type=Count(min=1), help="Synthetic training examples per task (default: the preset's)."),
    option("--dev-size", type=Count(min=1), help="Synthetic dev examples per task (default: the preset's)."),
    option("--train-once/--no-train-once", help="Sim: train once per workload and charge its steps again at every other clock."),
    WARMUP_OPTION, PRECISION_OPTION, peft_options,
    option("--strategy", type=click.Choice(["grid", "adaptive"]), help=STRATEGY_HELP),
    KNOBS_OPTION,
    option("--cpu-freqs", help="With cpu in --knobs: comma-separated CPU clocks in MHz (default: the device's table)."),
    option("--emc-freqs", help="With emc in --knobs: comma-separated EMC clocks in MHz (default: the device's table)."),
    KNOB_OPTION,
    option("--workloads", help="replay: comma-separated workloads of the --trace grid, by name (default: every one)."),
)

sweep_worker_options = option_group(
    "worker", SweepWorker,
    option("--settle-s", type=click.FloatRange(min=0), help="Hardware: idle this long before each point."),
    option("--observe", is_flag=True, hidden=True, help="Refused: a sweep pins every clock (meter a job with finetune/run --observe)."),
    option("--claims", "claims_uri", metavar="URI",
           help="Where workers of one sweep claim its points: postgresql://..., file:///PATH, tracking (an http(s) server's "
                "default) or none (default $DVFS_CLAIMS_URI, else what the tracking store allows; docs/fleet.md)."),
    option("--claim-ttl-s", type=click.FloatRange(min=1), help="A dead worker's claim is taken after this."),
)

train_options = option_group(
    "request", lazy("dvfs_mlops.mlops.train", "TrainRequest"),
    option("--sweep-id", help=SWEEP_ID_HELP),
    option("--sweeps-filter", metavar="FILTER",
           help="Learn from every sweep whose FINISHED points match this MLflow filter, e.g. \"params.device_profile = 'sim-orin'\"."),
    option("--mix-profiles", is_flag=True, help="Allow sweeps of different device profiles in one governor (refused by default)."),
    EXPERIMENT_OPTION,
    option("--objective", help="energy | edp | max-slowdown:X (least energy within X x the fastest)."),
    option("--trials", type=Count(min=1), help="Optuna trials of the selection study (each one a full inner CV)."),
    SEED_OPTION,
    option("--register/--no-register", help="Register the model as a new version."),
    option("--storage", help="Optuna storage URL (default: optuna.db beside a SQLite tracking DB)."),
    option("--study-name", help="Join this Optuna study (several processes may share one); default: a fresh study per run."),
    option("--cv-split", type=click.Choice(["auto", "workload", "task", "model"]), help="Groups held out (auto: task with 3+ tasks, else workload)."),
    option("--outer-trials", type=Count(min=1), help="Trials of each outer fold's study in nested CV (default: --trials)."),
)

evaluate_options = option_group(
    "request", lazy("dvfs_mlops.mlops.evaluate", "EvaluateRequest"),
    option("--sweep-id", help=SWEEP_ID_HELP),
    EXPERIMENT_OPTION,
    option("--split", type=click.Choice(["eval", "train", "all"]), help="Held-out (eval) workloads, or not."),
    option("--policies", help="Comma-separated; also models:/ URIs."),
    option("--objective", help="energy | edp | max-slowdown:X (as for train)."),
)

finetune_job_options = option_group(
    "job", FinetuneJobRequest,
    option("--model", help=f"A model preset ({', '.join(MODEL_PRESETS)}), a config.json or folder, or a hub ORG/NAME."),
    option("--model-config", help=MODEL_CONFIG_HELP),
    click.option("--task", required=True, help="A GLUE task (sst2, qnli, mrpc, qqp, rte, cola, stsb, mnli, wnli) or instruct (decoders)."),
    option("--pretrained", help="Real weights and tokenizer: a hub name (online) or a local folder."),
    option("--steps", type=Count(min=1), help="Training steps."),
    option("--epochs", type=click.FloatRange(min=0, min_open=True), help="Overrides --steps."),
    BATCH_SIZE_OPTION,
    option("--learning-rate", type=float, help="Default 1e-3 from scratch, 5e-5 with --pretrained."),
    PRECISION_OPTION,
    peft_options,
    DATA_SOURCE_OPTION,
    DATA_DIR_OPTION,
    option("--train-size", type=Count(min=1), help="Synthetic training examples."),
    SEED_OPTION,
    WARMUP_OPTION,
    KNOB_OPTION,
)

launch_options = option_group(
    "options", lazy("dvfs_mlops.mlops.launch", "LaunchOptions"),
    option("--governor", "governor_uri", help="A models:/ URI (default: the production governor of the board's family)."),
    option("--probe-steps", type=Count(min=0), help="Steps at maxn to measure GPU load; 0 = the twin's."),
    OBSERVE_OPTION,
    option("--strict", is_flag=True, help="Refuse a governor trained for another device profile."),
    option("--dry-run", is_flag=True, help="Stop after the decision (nothing is trained or logged)."),
    option("--save-model/--no-save-model", help="Log the fine-tuned model as an artifact."),
    option("--refine", type=Count(min=0), metavar="N", help="N steps probing clocks near the governor's, then the optimum; 0 = off (default 30, twin 0)."),
    option("--allow-other-board", is_flag=True, help="Let another board family's governor decide (recorded); else such a board refines."),
    KNOBS_OPTION,
)

curve_fit_options = option_group(
    "request", lazy("dvfs_mlops.app.curve_fit", "CurveFitRequest"),
    click.argument("file", required=False, default="", type=click.Path(dir_okay=False)),
    option("--clocks", help="Comma-separated clocks (MHz) to fit on (default: every row)."),
    option("--sweep-id", help="Read the points from this MLflow sweep instead of FILE (default with --workload: the newest with it)."),
    option("--workload", help="The workload, MODEL/TASK, of a sweep's points."),
    EXPERIMENT_OPTION,
    option("--voltage-shape", type=click.FloatRange(min=0), help="r in V(f) ~ 1 + r (f/f_max)^2 (default: the board's)."),
)

calibrate_options = option_group(
    "request", lazy("dvfs_mlops.mlops.calibration", "CalibrationRequest"),
    option("--source", metavar="V", help="The version to calibrate from (default: the richest other family's production)."),
    option("--preset", help="The sweep preset whose workloads are the candidates."),
    option("--steps", type=Count(min=0), help="Training steps per point (default the preset's; twin: 0 profiles)."),
    BATCH_SIZE_OPTION,
    EXPERIMENT_OPTION,
    option("--promote/--no-promote", help="Promote the calibrated version through the gates (default: only where this board's "
           "family has no production version yet; --promote replaces one, --no-promote never promotes)."),
)


clockd_options = option_group("options", ClockdOptions.from_cli, click.argument("device", default=""),
    click.option("--socket", default="", help="The service's socket (default $DVFS_CLOCKD_SOCKET, else /run/dvfs-mlops/clockd.sock)."),
    click.option("--group", default="dvfs", show_default=True, help="The group whose members may pin clocks through it."),
    click.option("--unit-dir", default="", help="Where install writes the systemd unit (default /etc/systemd/system)."),
    click.option("--max-lease", default="24h", show_default=True, help="serve, install: the longest a pin lasts, renewals included."))
