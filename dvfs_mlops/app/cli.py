"""`dvfs-mlops`: a click group of thin commands (parse, call, print).

Errors a user can cause are `DvfsError`s: printed as one line on stderr, exit code 2, no traceback.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads.zoo import PRESETS as MODEL_PRESETS


class Count(click.IntRange):
    """A whole-number option (steps, trials, sizes, seeds): typed INTEGER in --help, and a bad value is one line
    naming the option ("--steps must be a whole number, got 'x'")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                int(value.strip())
            except ValueError:
                name = param.opts[0] if param is not None and param.opts else "value"
                raise click.UsageError(f"{name} must be a whole number, got {value!r}", ctx) from None
        return super().convert(value, param, ctx)


PRECISION_OPTION = click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "fp16"]),
                                help="Training precision: autocast to bf16 or fp16 (fp16 with a gradient scaler); the twin "
                                     "charges tensor-core rates for 16-bit matmuls. Recorded on every run.")


def peft_options(command: Any) -> Any:
    """--peft and the LoRA options, on every command that trains (sweep, finetune)."""
    options = [
        click.option("--peft", "peft_method", default="full", show_default=True, type=click.Choice(["full", "lora"]),
                     help="full: every weight trains; lora: the base is frozen and low-rank adapters (peft) plus the task head "
                          "train. Part of the workload's name (+lora-r8a16), so a LoRA run never resumes a full one."),
        click.option("--lora-r", default=None, type=Count(min=1), help="LoRA rank (default 8)."),
        click.option("--lora-alpha", default=None, type=Count(min=1), help="LoRA scale alpha (default 16)."),
        click.option("--lora-targets", default="", help="Comma-separated module names LoRA adapts (default: peft's table for the "
                                                        "architecture, e.g. q_proj,v_proj for Llama/Qwen, query,value for BERT)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _peft(method: str, r: int | None, alpha: int | None, targets: str) -> Any:
    from dvfs_mlops.job.workloads.adapters import peft_spec

    return peft_spec(method, r, alpha, targets or None)


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (messages and links go to stderr).")
SEED_OPTION = click.option("--seed", default=0, show_default=True, type=Count(), help="Random seed (data, model init, sampling): same seed, same run.")

DEVICE_OPTION = click.option("--device", "device_name", default="auto", show_default=True,
                             type=click.Choice(["auto", "jetson", "nvml", "sim"]), help="Device backend.")
SAMPLE_HZ_OPTION = click.option("--sample-hz", default=50.0, show_default=True, type=click.FloatRange(min=0.1),
                                help="Power sampling rate of the meter (jetson, nvml).")
GPU_INDEX_OPTION = click.option("--gpu-index", default=0, show_default=True, type=click.IntRange(min=0),
                                help="nvml: which GPU, by NVML index (nvidia-smi's order, PCI bus order; CUDA's own "
                                     "order can differ, the backend maps it by UUID).")
OBSERVE_OPTION = click.option("--observe", is_flag=True,
                              help="Meter only: write no clock or setting, take no lock (no root needed); runs are tagged dvfs.observe=true.")
TWIN_PROFILE_OPTION = click.option("--twin-profile", default=None, metavar="NAME",
                                   help="sim: the twin's board profile, sim-orin (default, shaped after the study) or "
                                        "sim-orin-measured (GPU-rail power after public Orin measurements).")
TWIN_PARAMS_OPTION = click.option("--twin-params", default=None, type=click.Path(exists=True, dir_okay=False), metavar="FILE.yaml",
                                  help="sim: a YAML of twin constants over --twin-profile's (e.g. written by `dvfs-mlops twin fit`).")
DEVICE_ID_OPTION = click.option("--device-id", default="", metavar="ID",
                                help="Which board this is, tagged dvfs.device_id on every run (default: the Jetson's serial number, "
                                     "the NVML GPU's UUID, sim@HOST on the twin). Not part of a sweep's identity: boards given "
                                     "the same sweep share it.")
TORCH_DEVICE_OPTION = click.option("--torch-device", default="", metavar="DEV",
                                   help="Train on DEV (cpu, cuda:1 ...) instead of the backend's own GPU; for tests and "
                                        "unusual set-ups only: a clock pinned on a GPU that does not train saves nothing.")


class DvfsGroup(click.Group):
    """Every user error is one line on stderr and exit code 2: ours (DvfsError) and click's usage errors."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except DvfsError as e:
            _one_line_error(str(e))
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "dvfs-mlops"
            _one_line_error(f"{e.format_message()} (see '{where} --help')")
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except Exception as e:
            from dvfs_mlops.mlops import tracking

            if not tracking.is_connection_failure(e):
                raise
            _one_line_error(f"the MLflow tracking store {tracking.tracking_uri()} stopped answering "
                            f"({str(e).strip().splitlines()[0][:200]}); start it again, then re-run the same command "
                            "(a sweep resumes; the clocks were restored)")
        sys.exit(rv if isinstance(rv, int) else 0)


def _one_line_error(message: str) -> None:
    click.echo("Error: " + " ".join(message.split()), err=True)
    sys.exit(2)


@click.group(cls=DvfsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dvfs-mlops")
def main() -> None:
    """Energy-optimal GPU clocks for on-device fine-tuning, as an MLOps pipeline."""
    from dvfs_mlops import settings

    settings.set_defaults(settings.CLI_DEFAULTS)  # no progress bars (\r redraws) in a command's output
    import logging

    for noisy in ("mlflow.store.db.utils", "alembic", "mlflow.tracking.fluent"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def _show_link(make: Any, err: bool = False) -> None:
    """The last lines of a command that wrote runs: where to look in the MLflow UI (and how to start it for a
    local store). `make` builds the tracking.UiLink; a failure to build it never fails the command's work."""
    import logging

    try:
        link = make()
    except Exception as e:  # noqa: BLE001 - the work is done and logged; only the link is missing
        logging.getLogger(__name__).debug("no MLflow UI link: %s", e)
        return
    if link is None:
        return
    if link.start:
        click.echo(f"start the MLflow UI: {link.start}", err=err)
        click.echo(f"then open: {link.url}", err=err)
    else:
        click.echo(f"open in the MLflow UI: {link.url}", err=err)


def _announce(dev: Any, requested: str) -> None:
    from dvfs_mlops.hw import describe_device

    _echo_err(describe_device(dev, requested))


def _twin(twin_profile: str | None, twin_params: str | None) -> Any:
    """The twin's constants for --twin-profile/--twin-params (checked before anything runs), None when neither is given."""
    if twin_profile is None and not twin_params:
        return None
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    return load_twin_params(twin_profile, twin_params)


def _open(device_name: str, sample_hz: float = 50.0, quiet: bool = False, gpu_index: int = 0, twin: Any = None,
          device_id: str = "") -> Any:
    from dvfs_mlops.hw import open_device

    if twin is not None and device_name not in ("auto", "sim"):
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin; drop them or use --device sim (not {device_name})")
    dev = open_device(device_name, sample_hz=sample_hz, gpu_index=gpu_index, twin_params=twin, announce=None if quiet else _echo_err)
    if twin is not None and not dev.simulated:
        raise DvfsError(f"--twin-profile/--twin-params describe the simulated twin, but --device auto found {dev.name}; "
                        "drop them or use --device sim")
    if device_id.strip():
        dev.device_id = device_id.strip()
    return dev


def _torch_device(dev: Any, override: str) -> str:
    """Where training runs, checked before any clock is touched (CUDA missing: one-line error)."""
    from dvfs_mlops.hw.placement import resolve_torch_device

    return resolve_torch_device(dev, override or None)


@main.command()
@DEVICE_OPTION
@GPU_INDEX_OPTION
@JSON_OPTION
def devices(device_name: str, gpu_index: int, as_json: bool) -> None:
    """Show the backend, its frequency table, current clock and power rails."""
    info = _open(device_name, quiet=as_json, gpu_index=gpu_index).info()
    if as_json:
        click.echo(json.dumps(info.to_dict(), indent=2))
        return
    label = " (SIMULATED)" if info.simulated else ""
    click.echo(f"backend:      {info.backend}{label}")
    click.echo(f"profile:      {info.profile}")
    click.echo(f"frequencies:  {', '.join(f'{f:g}' for f in info.frequencies_mhz)} MHz")
    click.echo(f"current:      {f'{info.current_mhz:g} MHz' if info.current_mhz else 'n/a'}")
    click.echo(f"governor:     {info.governor or 'n/a'}")
    click.echo(f"rails:        {', '.join(info.rails) or 'none found'}")
    for k, v in info.detail.items():
        click.echo(f"{k + ':':13s} {v}")


@main.command()
@click.argument("model", required=False)
@click.option("--model-config", type=click.Path(), help="A transformers config.json (or folder) instead of a preset.")
@click.option("--seq-len", type=Count(min=1), default=None, help="Padded sequence length of a batch (required unless --task).")
@click.option("--task", default="", help="Trace this task's head: a GLUE task's classifier, or instruct's LM head and loss "
                                          "(a decoder only); without --seq-len, the task's mean length padded to 8.")
@click.option("--batch-size", type=Count(min=1), default=16, show_default=True, help="Examples per training step.")
@PRECISION_OPTION
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None, hidden=True,
              help="The torch dtype's name instead of --precision (kept for older scripts).")
@TWIN_PROFILE_OPTION
@TWIN_PARAMS_OPTION
@JSON_OPTION
def simulate(model: str | None, model_config: str | None, seq_len: int | None, batch_size: int, precision: str, dtype: str | None,
             twin_profile: str | None, twin_params: str | None, as_json: bool, task: str = "") -> None:
    """The simulated Orin's per-step time/power/energy curve for MODEL (SIMULATED)."""
    from dvfs_mlops.app.simulate import simulate_curve
    from dvfs_mlops.job.finetune import PRECISIONS

    dtype = dtype or PRECISIONS[precision]

    if model and model_config:
        raise DvfsError("give either MODEL or --model-config, not both")
    if seq_len is None and not task:  # --seq-len is required unless the task's mean length stands in for it
        ctx = click.get_current_context()
        raise click.MissingParameter(ctx=ctx, param=next(p for p in ctx.command.params if p.name == "seq_len"))
    twin = _twin(twin_profile, twin_params)
    result = simulate_curve(model, model_config, seq_len, batch_size, dtype, params=twin, task=task or None)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    on_task = f" on {result['task']}" if result["task"] else ""
    click.echo(f"{result['model']}{on_task}: batch {batch_size}, seq {result['seq_len']}, {result['num_params'] / 1e6:.1f}M params "
               f"on {result['device_profile']} (SIMULATED)")
    click.echo(f"{'freq_mhz':>9} {'time_s':>9} {'power_w':>8} {'energy_j':>9} {'gpu_util':>8}")
    for pt in [*result["points"], result["maxn"]]:
        f = pt["freq_mhz"]
        name = f"maxn@{pt['settled_mhz']:g}" if f == "maxn" else f"{f:g}"
        mark = " <- optimal" if f == result["optimal_freq_mhz"] else ""
        click.echo(f"{name:>9} {pt['time_s']:9.4f} {pt['avg_power_w']:8.2f} {pt['energy_j']:9.4f} {pt['gpu_util_pct']:7.1f}%{mark}")
    click.echo(f"energy-optimal: {result['optimal_freq_mhz']:g} MHz, saving {100 * result['saving_vs_maxn']:.1f}% vs maxn (simulated)")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--freq", default="", help="Clock in MHz from the device's table, or 'maxn' (required unless --observe).")
@DEVICE_OPTION
@SAMPLE_HZ_OPTION
@GPU_INDEX_OPTION
@OBSERVE_OPTION
@TWIN_PROFILE_OPTION
@TWIN_PARAMS_OPTION
@DEVICE_ID_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the EnergyReport as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(freq: str, device_name: str, sample_hz: float, gpu_index: int, observe: bool, twin_profile: str | None, twin_params: str | None,
        as_json: bool, command: tuple[str, ...], device_id: str = "") -> None:
    """Pin the clock, run COMMAND (no shell), meter its energy, restore; exit with its code."""
    from dvfs_mlops.app.run import check_command, run_metered
    from dvfs_mlops.hw import parse_freq

    if not freq and not observe:
        raise DvfsError("give --freq MHZ (or maxn), or --observe to meter without touching the clock")
    dev = _open(device_name, sample_hz, quiet=True, gpu_index=gpu_index, twin=_twin(twin_profile, twin_params), device_id=device_id)
    freq = freq or "maxn"
    parse_freq(freq, dev.frequencies_mhz)  # bad input is an error before anything is announced or run
    check_command(list(command))
    _announce(dev, device_name)
    rc, report = run_metered(dev, freq, list(command), observe=observe)
    if as_json:
        click.echo(json.dumps({"freq": freq, "observe": observe, "device": dev.name, "device_profile": dev.profile,
                               "device_id": getattr(dev, "device_id", None), "returncode": rc, **report.to_dict()}, indent=2))
    else:
        label = " (SIMULATED)" if report.simulated else ""
        clock = f", clock {report.clock_mhz_measured:.0f} MHz measured" if report.clock_mhz_measured is not None else ""
        held = {True: " (held)", False: " (did NOT hold the pinned clock)", None: ""}[report.clock_held]
        failed = f", {report.samples_failed} failed" if report.samples_failed else ""
        click.echo(
            f"energy{label}: {report.energy_j:.2f} J CPU+GPU, {report.energy_total_j:.2f} J all rails, "
            f"{report.duration_s:.2f} s, avg {report.avg_power_w:.2f} W, peak {report.peak_power_w:.2f} W, "
            f"{report.samples} samples{failed}{clock}{held}{' [observe]' if observe else ''}; exit code {rc}",
            err=True,
        )
    sys.exit(rc)


@main.command()
@click.option("--preset", default="quick", show_default=True, help="smoke | quick | paper.")
@click.option("--models", default="", help="Comma-separated models (default: the preset's): presets, transformers config.json files or folders, hub names ORG/NAME (online, or a local folder with weights).")
@click.option("--tasks", default="", help="Comma-separated tasks (default: the preset's): GLUE tasks, or instruct (causal LM, "
                                          "decoder models only).")
@click.option("--freqs", default="", help="Comma-separated clocks in MHz (maxn is always added); default: the preset's or the whole table.")
@click.option("--steps", default=None, type=Count(min=0), help="Training steps per point (default: the preset's); 0 = profile only (sim).")
@click.option("--profile-steps", default=None, type=Count(min=1), help="Steps charged per point when --steps 0 (default: the preset's).")
@click.option("--batch-size", default=16, show_default=True, type=Count(min=1), help="Examples per training step.")
@click.option("--repeats", default=None, type=Count(min=1),
              help="Repeats per point (default: the preset's, 1); on hardware each repeat visits the clocks in its own seeded random order.")
@DEVICE_OPTION
@SAMPLE_HZ_OPTION
@GPU_INDEX_OPTION
@TORCH_DEVICE_OPTION
@TWIN_PROFILE_OPTION
@TWIN_PARAMS_OPTION
@click.option("--settle-s", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Hardware: idle this many seconds before each point after the first (cool-down, so points start alike).")
@click.option("--observe", is_flag=True, hidden=True, help="Refused: a sweep pins every clock (meter a job with finetune/run --observe).")
@click.option("--data-source", default="synthetic", show_default=True, type=click.Choice(["synthetic", "tsv", "hub"]),
              help="Where task data comes from: built-in synthetic GLUE-like tasks, GLUE TSV files (--data-dir), or the hub (online).")
@click.option("--data-dir", default="", help="A GLUE TSV folder; for instruct, instruct/train.jsonl and dev.jsonl in it "
                                             "(implies --data-source tsv).")
@SEED_OPTION
@click.option("--experiment", default="dvfs-sweep", show_default=True, help="MLflow experiment the sweep's runs go to.")
@click.option("--sweep-id", default="", help="Resume/extend this sweep id (default: a hash of the sweep's definition).")
@click.option("--train-size", default=None, type=Count(min=1), help="Synthetic training examples per task (default: the preset's).")
@click.option("--dev-size", default=None, type=Count(min=1), help="Synthetic dev examples per task (default: the preset's).")
@click.option("--replay/--no-replay", default=True, show_default=True, help="Sim: train once per workload and replay its steps at every clock.")
@PRECISION_OPTION
@DEVICE_ID_OPTION
@click.option("--claims", "claims_uri", default="", metavar="URI",
              help="Where workers given the same sweep claim its points, so each point runs once: postgresql://... (a fleet; "
                   "default $DVFS_CLAIMS_URI, else the tracking store's database when it is PostgreSQL), file:///PATH, or none. "
                   "A SQLite or file store claims in a locked file beside it; an http(s) server without this claims nothing.")
@click.option("--claim-ttl-s", default=120.0, show_default=True, type=click.FloatRange(min=1),
              help="A claim lasts this long after its last heartbeat (every third of it): a dead worker's points are taken over after it.")
@peft_options
@click.option("--strategy", default="grid", show_default=True, type=click.Choice(["grid", "adaptive"]),
              help="grid: every clock; adaptive: maxn plus at most 4 clocks per workload, chosen by the curve model starting "
                   "from the production governor's clock (unmeasured clocks are predicted on the parent run, never logged as points).")
def sweep(preset: str, models: str, tasks: str, freqs: str, steps: int | None, profile_steps: int | None, batch_size: int,
          repeats: int | None, device_name: str, sample_hz: float, gpu_index: int, torch_device: str, twin_profile: str | None,
          twin_params: str | None, settle_s: float, observe: bool,
          data_source: str, data_dir: str, seed: int, experiment: str, sweep_id: str,
          train_size: int | None, dev_size: int | None, replay: bool, strategy: str = "grid", precision: str = "fp32",
          peft_method: str = "full", lora_r: int | None = None, lora_alpha: int | None = None, lora_targets: str = "",
          device_id: str = "", claims_uri: str = "", claim_ttl_s: float = 120.0) -> None:
    """Fine-tune each workload at each clock; one MLflow run per point (resumable; several workers may share a sweep)."""
    from dvfs_mlops.mlops import sweep as sweep_mod
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.claims import open_claims

    if observe:
        raise DvfsError("a sweep exists to pin each clock, so it has no --observe; meter a job as found with "
                        "`dvfs-mlops finetune --observe` or `dvfs-mlops run --observe -- CMD`")
    peft = _peft(peft_method, lora_r, lora_alpha, lora_targets)
    twin = _twin(twin_profile, twin_params)
    sweep_mod.check_names(preset, models=models, tasks=tasks, strategy=strategy, precision=precision)  # a typo: at once
    tracking.check_reachable()  # before the device is even opened
    claims = open_claims(claims_uri or None, tracking.tracking_uri())  # an unreachable claims database: before any clock too
    dev = _open(device_name, sample_hz, quiet=True, gpu_index=gpu_index, twin=twin, device_id=device_id)
    where = _torch_device(dev, torch_device)
    spec = sweep_mod.build_spec(
        dev, preset, models=models, tasks=tasks, freqs=freqs, steps=steps, profile_steps=profile_steps, batch_size=batch_size,
        repeats=repeats, seed=seed, data_source=data_source, data_dir=data_dir or None, experiment=experiment, replay=replay,
        sweep_id=sweep_id or None, train_size=train_size, dev_size=dev_size, strategy=strategy, precision=precision, peft=peft,
    )
    _announce(dev, device_name)
    start_clock = _adaptive_start(dev) if strategy == "adaptive" else None
    out = sweep_mod.run_sweep(spec, dev, announce=_echo_err, torch_device=where, settle_s=settle_s, start_clock=start_clock,
                              claims=claims, claim_ttl_s=claim_ttl_s)
    label = " (SIMULATED)" if dev.simulated else ""
    others = f", {len(out.by_others)} were run by other workers" if out.by_others else ""
    click.echo(f"sweep {out.sweep_id}{label}: ran {len(out.ran)} points, {len(out.skipped)} were already finished{others}; "
               f"parent run {out.parent_run_id} in experiment {out.experiment_id}")
    _show_link(lambda: tracking.experiment_link(out.experiment_id))  # the runs table: expand the parent run for its points


def _adaptive_start(dev: Any) -> Any:
    """The production governor's clock for a workload's features, where an adaptive sweep starts; None without one."""
    from dvfs_mlops.app.finetune import decide, resolve_governor

    try:
        model, meta = resolve_governor(None)
    except DvfsError as e:
        _echo_err(f"adaptive sweep: no production governor ({str(e).splitlines()[0][:120]}); each workload starts at the middle of the table")
        return None
    _echo_err(f"adaptive sweep: each workload starts at the clock of {meta.get('name')} v{meta.get('version')}")
    return lambda features: decide(model, meta, features, dev.frequencies_mhz)[0]


@main.command()
@click.option("--sweep-id", default="", help="The sweep to learn from, or several as a,b,... (one dataset; default: the latest in --experiment).")
@click.option("--sweeps-filter", default="", metavar="FILTER",
              help="Learn from every sweep of --experiment with FINISHED points matching this MLflow filter, e.g. "
                   "\"params.device_profile = 'sim-orin'\" or \"tags.`dvfs.device_id` LIKE 'orin-%'\".")
@click.option("--mix-profiles", is_flag=True, help="Allow sweeps of different device profiles in one governor (refused by default).")
@click.option("--experiment", default="dvfs-sweep", show_default=True, help="Where the sweep's runs are.")
@click.option("--objective", default="energy", show_default=True,
              help="What the best clock minimises: energy | edp (energy x delay) | max-slowdown:X (least energy within X times the fastest time).")
@click.option("--trials", default=60, show_default=True, type=Count(min=1), help="Optuna trials of the selection study (each one a full inner CV).")
@SEED_OPTION
@click.option("--register/--no-register", default=True, show_default=True, help="Register the model as a new version.")
@click.option("--storage", default="", help="Optuna storage URL (default: optuna.db beside a SQLite tracking DB).")
@click.option("--study-name", default="", help="Join this Optuna study (several processes may share one); default: a fresh study per run.")
@click.option("--cv-split", default="auto", show_default=True, type=click.Choice(["auto", "workload", "task", "model"]),
              help="Groups held out for selection and the reported score (auto: task with 3+ tasks, else workload).")
@click.option("--outer-trials", default=None, type=Count(min=1),
              help="Trials of each outer fold's own study in nested CV (default: --trials).")
def train(sweep_id: str, experiment: str, objective: str, trials: int, seed: int, register: bool, storage: str, study_name: str,
          cv_split: str, outer_trials: int | None, sweeps_filter: str = "", mix_profiles: bool = False) -> None:
    """Train the governor: Optuna picks a family (curve or classifier tree) and its hyper-parameters; nested CV reports held-out regret."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import load_config
    from dvfs_mlops.mlops.train import train_governor
    from dvfs_mlops.model.governor.policy_tree import features_used

    out = train_governor(sweep_id or None, experiment, objective, trials, seed, register, say=_echo_err, storage=storage or None,
                         study_name=study_name or None, cv_split=cv_split, outer_trials=outer_trials, sweeps_filter=sweeps_filter,
                         mix_profiles=mix_profiles)
    r = out.result
    truth = "expected (noise-free) curves, SIMULATED" if r.expected_truth else "mean-over-repeats curves"
    click.echo(f"held-out regret (nested CV, against {truth}; mean [95% CI] over workloads):")
    click.echo(f"{'split':<16} {'governor':>22} {'FFG':>22} {'paper-mlg':>22}")

    def cell(s: Any) -> str:
        lo, hi = s.ci
        return f"{100 * s.regret:6.2f}% [{100 * lo:5.2f},{100 * hi:5.2f}]"

    for split, ns in r.nested.items():
        mark = " *" if split == r.split else ""
        click.echo(f"{'one ' + split + mark:<16} {cell(ns.governor):>22} {cell(ns.ffg):>22} {cell(ns.paper):>22}")
    click.echo(f"(* the split gates read; selection study {r.study_name}: inner regret {100 * r.tree.regret:.2f}%, optimistic)")
    used = sorted(features_used(r.policy.policy["tree"]))
    click.echo(f"best governor: {r.family} tree, depth {_depth(r.policy.policy)}, splits on {', '.join(used) or 'nothing (one clock for all)'} "
               f"(offered: {', '.join(r.best_params.features)})")
    if out.version is not None:
        click.echo(f"registered dvfs-governor v{out.version} (run {out.run_id}); promote it with: dvfs-mlops registry promote {out.version}")
        version = out.version
        _show_link(lambda: tracking.model_version_link(load_config().name, version))
    else:
        click.echo(f"logged {out.model_uri} (not registered)")
        _show_link(lambda: tracking.run_link(out.run_id))


def _depth(policy: dict) -> int:
    from dvfs_mlops.model.governor.policy_tree import tree_depth

    return tree_depth(policy["tree"])


@main.command("finetune")
@click.option("--model", default="", help=f"A model preset ({', '.join(MODEL_PRESETS)}), a transformers config.json or folder, "
                                         "or a hub name ORG/NAME (as sweep --models takes them).")
@click.option("--model-config", default="", help="A transformers config.json (or folder) instead of a preset.")
@click.option("--task", required=True, help="A GLUE task (sst2, qnli, mrpc, qqp, rte, cola, stsb, mnli, wnli) or instruct "
                                             "(causal LM on prompt/response pairs; a decoder model).")
@click.option("--pretrained", default="", help="Real weights and tokenizer: a hub name (online) or a local folder.")
@click.option("--governor", "governor_uri", default="", help="A models:/ URI (default models:/dvfs-governor@production).")
@DEVICE_OPTION
@SAMPLE_HZ_OPTION
@GPU_INDEX_OPTION
@OBSERVE_OPTION
@TORCH_DEVICE_OPTION
@TWIN_PROFILE_OPTION
@TWIN_PARAMS_OPTION
@DEVICE_ID_OPTION
@click.option("--steps", default=60, show_default=True, type=Count(min=1), help="Training steps.")
@click.option("--epochs", default=None, type=click.FloatRange(min=0, min_open=True), help="Overrides --steps.")
@click.option("--batch-size", default=16, show_default=True, type=Count(min=1), help="Examples per training step.")
@click.option("--learning-rate", default=None, type=float, help="Default 1e-3 from scratch, 5e-5 with --pretrained.")
@PRECISION_OPTION
@peft_options
@click.option("--probe-steps", default=5, show_default=True, type=Count(min=0), help="Steps at maxn to measure GPU utilisation; 0 = the twin's estimate.")
@click.option("--data-source", default="synthetic", show_default=True, type=click.Choice(["synthetic", "tsv", "hub"]),
              help="Where task data comes from: built-in synthetic GLUE-like tasks, GLUE TSV files (--data-dir), or the hub (online).")
@click.option("--data-dir", default="", help="A GLUE TSV folder; for instruct, instruct/train.jsonl and dev.jsonl in it, or "
                                             "the folder holding them (implies --data-source tsv).")
@click.option("--train-size", default=2048, show_default=True, type=Count(min=1), help="Synthetic training examples.")
@SEED_OPTION
@click.option("--strict", is_flag=True, help="Refuse a governor trained for another device profile.")
@click.option("--dry-run", is_flag=True, help="Stop after the decision (nothing is trained or logged).")
@click.option("--no-save-model", is_flag=True, help="Do not log the fine-tuned model as an artifact.")
@click.option("--refine", default=None, type=Count(min=0), metavar="N",
              help="Probe-and-refine: N training steps spent probing clocks around the governor's, then the rest at the curve "
                   "model's optimum (probes count in the totals); 0 = off. Default: 30 on jetson and nvml, 0 on the twin.")
@JSON_OPTION
def finetune_cmd(model: str, model_config: str, task: str, pretrained: str, governor_uri: str, device_name: str, sample_hz: float,
                 gpu_index: int, observe: bool, torch_device: str, twin_profile: str | None, twin_params: str | None, steps: int, epochs: float | None, batch_size: int, learning_rate: float | None, probe_steps: int, data_source: str,
                 data_dir: str, train_size: int, seed: int, strict: bool, dry_run: bool, no_save_model: bool, as_json: bool,
                 refine: int | None = None, precision: str = "fp32", peft_method: str = "full", lora_r: int | None = None,
                 lora_alpha: int | None = None, lora_targets: str = "", device_id: str = "") -> None:
    """Fine-tune at the clock the production governor picks (metered, logged, always restored)."""
    from dvfs_mlops.app.finetune import run_finetune
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import tracking

    if not (model or model_config or pretrained):
        raise DvfsError("name the model: --model PRESET, --model-config PATH or --pretrained NAME_OR_PATH")
    if model and not (model_config or pretrained) and model not in MODEL_PRESETS:  # a config or hub name, named as a sweep names it
        from dvfs_mlops.job.workloads.zoo import model_entry

        entry = model_entry(model)
        model, model_config, pretrained = entry.name, entry.config_path or "", entry.pretrained or ""
    peft = _peft(peft_method, lora_r, lora_alpha, lora_targets)
    twin = _twin(twin_profile, twin_params)
    if not dry_run:  # a dry run asks the store only if its governor is not remembered (launcher.resolve_governor)
        tracking.check_reachable()
    prepared = prepare_workload(model or None, task, model_config_path=model_config or None, pretrained=pretrained or None,
                                data_source=data_source, data_dir=data_dir or None, seed=seed, train_size=train_size, peft=peft,
                                precision=precision)
    dev = _open(device_name, sample_hz, quiet=True, gpu_index=gpu_index, twin=twin, device_id=device_id)
    where = _torch_device(dev, torch_device)  # CUDA missing: stop before the probe touches anything
    lr = learning_rate if learning_rate is not None else (5e-5 if pretrained else 1e-3)
    cfg = FinetuneConfig(steps=steps, epochs=epochs, batch_size=batch_size, learning_rate=lr, seed=seed, precision=precision, peft=peft)
    summary = run_finetune(dev, prepared, cfg, governor_uri=governor_uri or None, probe_steps=probe_steps, dry_run=dry_run,
                           strict=strict, save_model=not no_save_model, pretrained=pretrained or None, say=_echo_err,
                           announce_device=not as_json, torch_device=where, observe=observe, refine=refine)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
    if summary.get("run_id"):
        _show_link(lambda: tracking.run_link(summary["run_id"]), err=as_json)


@main.group()
def curve() -> None:
    """The per-workload curve model: time, power and energy at every clock from a few measured ones."""


@curve.command("fit")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--clocks", default="", help="Comma-separated clocks (MHz) to fit on (default: every row).")
@click.option("--sweep-id", default="", help="Read the points from this MLflow sweep instead of FILE.")
@click.option("--workload", default="", help="With --sweep-id: the workload, MODEL/TASK.")
@click.option("--experiment", default="dvfs-sweep", show_default=True, help="With --sweep-id: where the sweep's runs are.")
@click.option("--voltage-shape", default=None, type=click.FloatRange(min=0),
              help="r in V(f) ~ 1 + r (f/f_max)^2 (default: the Orin's, 0.43).")
@JSON_OPTION
def curve_fit(file: str | None, clocks: str, sweep_id: str, workload: str, experiment: str, voltage_shape: float | None,
              as_json: bool) -> None:
    """Fit time = a + b/f and power = c + d V(f)^2 f on some clocks; predict every clock and the energy optimum."""
    from dvfs_mlops.model import curve as cm

    if bool(file) == bool(sweep_id):
        raise DvfsError("give either FILE (a CSV of freq_mhz, time_s, energy_j rows) or --sweep-id ID --workload MODEL/TASK")
    sweep = None
    if sweep_id:
        if not workload:
            raise DvfsError("--sweep-id needs --workload MODEL/TASK")
        from dvfs_mlops.mlops.queries import sweep_points

        sweep = sweep_points(experiment, sweep_id)
        if workload not in sweep.workloads:
            raise DvfsError(f"sweep {sweep.sweep_id!r} has no pinned points of workload {workload!r}; "
                            f"it has {', '.join(sorted(sweep.workloads))}")
        points = sweep.workloads[workload]
    else:
        points = cm.read_measurements_csv(file or "")
    table = sorted({m.freq_mhz for m in points})
    shape = cm.ORIN_VOLTAGE_SHAPE if voltage_shape is None else voltage_shape
    chosen = points
    if clocks.strip():
        try:
            wanted = [float(x) for x in clocks.split(",") if x.strip()]
        except ValueError:
            raise DvfsError(f"--clocks must be comma-separated numbers in MHz, got {clocks!r}") from None
        chosen = cm.select_clocks(points, wanted)
    prior = None
    if sweep is not None:  # the board's power prior from the sweep's other workloads, as the adaptive sweep's predicted.csv
        from dvfs_mlops.model.governor.dataset import power_noise
        from dvfs_mlops.model.power_prior import leave_one_out_priors

        names = sorted(sweep.workloads)
        others = [chosen if n == workload else sweep.workloads[n] for n in names]
        prior = leave_one_out_priors(others, voltage_shape=shape, f_max_mhz=max(table),
                                     noise=power_noise(sweep.device_profile))[names.index(workload)]
    fit = cm.fit_curve(chosen, voltage_shape=shape, f_max_mhz=max(table), prior=prior)
    pred = fit.predict(table)
    best = min(pred, key=lambda p: p.energy_j)
    fitted_on = sorted({m.freq_mhz for m in chosen})
    if as_json:
        click.echo(json.dumps({
            "points": [{"freq_mhz": p.freq_mhz, "time_s": p.time_s, "power_w": p.power_w, "energy_j": p.energy_j,
                        "energy_std_j": p.energy_std_j, "measured": p.freq_mhz in fitted_on} for p in pred],
            "optimal_freq_mhz": best.freq_mhz, "fitted_on_mhz": fitted_on,
            "params": {"a_s": fit.a, "b_s_ghz": fit.b, "c_w": fit.c, "d_w_per_ghz": fit.d, "voltage_shape": fit.voltage_shape},
            "power_prior": None if fit.prior is None else json.loads(fit.prior.to_json()),
        }, indent=2))
        return
    load = "V(f)^2 f[GHz]" if fit.prior is None else f"V(f)^2 f[GHz] ({fit.prior.idle_share:g} + {1 - fit.prior.idle_share:g} u(f))"
    click.echo(f"fitted on {', '.join(f'{f:g}' for f in fitted_on)} MHz: time = {fit.a:.4g} + {fit.b:.4g}/f[GHz] s, "
               f"power = {fit.c:.4g} + {fit.d:.4g} {load} W")
    if fit.prior is not None:
        click.echo(f"power prior from {fit.prior.workloads} other workloads of the sweep: log dynamic/static ratio "
                   f"{fit.prior.log_ratio_mean:.3f} +- {fit.prior.log_ratio_sd:.3f} (as the adaptive sweep's predicted.csv)")
    click.echo(f"{'freq_mhz':>9} {'time_s':>10} {'power_w':>9} {'energy_j':>10} {'+/- J':>8}")
    for p in pred:
        sd = f"{p.energy_std_j:8.3g}" if p.energy_std_j is not None else "     n/a"
        mark = "  (fitted on)" if p.freq_mhz in fitted_on else ""
        click.echo(f"{p.freq_mhz:9g} {p.time_s:10.4g} {p.power_w:9.4g} {p.energy_j:10.4g} {sd}{mark}")
    click.echo(f"optimal_freq_mhz: {best.freq_mhz:g}")


@main.command("evaluate")
@click.option("--sweep-id", default="", help="The sweep whose measured points are compared (default: the latest in --experiment).")
@click.option("--experiment", default="dvfs-sweep", show_default=True, help="Where the sweep's runs are.")
@click.option("--split", default="eval", show_default=True, type=click.Choice(["eval", "train", "all"]),
              help="Which of the sweep's workloads: the held-out ones (eval), the training ones, or all.")
@click.option("--policies", default="production,ffg,paper-mlg,maxn,oracle", show_default=True,
              help="Comma-separated: production, ffg, paper-mlg, maxn, oracle, or models:/ URIs.")
@click.option("--objective", default="energy", show_default=True, help="energy | edp | max-slowdown:X (as for train).")
@JSON_OPTION
def evaluate_cmd(sweep_id: str, experiment: str, split: str, policies: str, objective: str, as_json: bool) -> None:
    """Savings against MAXN and regret against the oracle (measured, and expected on the twin) with 95% intervals."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.evaluate import evaluate_sweep, format_table

    report = evaluate_sweep(sweep_id or None, experiment, split, [p.strip() for p in policies.split(",") if p.strip()], objective,
                            say=_echo_err)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else format_table(report))
    if report.run_id:
        run_id = report.run_id
        _show_link(lambda: tracking.run_link(run_id), err=as_json)


@main.group()
def registry() -> None:
    """The governor in the MLflow Model Registry."""


@registry.command("list")
@JSON_OPTION
def registry_list(as_json: bool) -> None:
    """Versions with aliases and held-out (nested CV) figures."""
    from dvfs_mlops.mlops.registry import list_versions

    versions = list_versions()
    if as_json:
        click.echo(json.dumps(versions, indent=2, default=str))
        return
    if not versions:
        click.echo("no governor versions yet: run `dvfs-mlops train` or `dvfs-mlops registry bootstrap`")
    for v in versions:
        m = v["metrics"]
        regret = (f"held-out regret {100 * m['tree_outer_regret']:.2f}%" if "tree_outer_regret" in m
                  else f"LOOCV regret {100 * m['tree_loocv_regret']:.2f}%" if "tree_loocv_regret" in m else "no CV figures")
        aliases = ",".join(v["aliases"]) or "-"
        click.echo(f"v{v['version']:<3} {aliases:<20} {v['tags'].get('objective', '?'):<8} {v['tags'].get('device_profile', '?'):<22} "
                   f"sweep {v['tags'].get('sweep_id') or '-':<18} {regret}")


@registry.command("show")
@click.argument("version")
def registry_show(version: str) -> None:
    """One version's tags, aliases and metrics (JSON)."""
    from dvfs_mlops.mlops.registry import show_version

    click.echo(json.dumps(show_version(version), indent=2, default=str))


@registry.command("bootstrap")
def registry_bootstrap() -> None:
    """Register the published tree (baselines/paper-mlg.json of the registry data) as a version."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import bootstrap, load_config

    version = bootstrap(say=click.echo)
    _show_link(lambda: tracking.model_version_link(load_config().name, version))


def _show_production_link() -> None:
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import load_config

    def make() -> Any:
        cfg = load_config()
        return tracking.model_version_link_by_alias(cfg.name, cfg.production)

    _show_link(make)


@registry.command("promote")
@click.argument("version")
@click.option("--force", is_flag=True, help="Promote even if a gate fails.")
def registry_promote(version: str, force: bool) -> None:
    """Check the gates of governor.yaml (the registry data), then alias VERSION as production."""
    from dvfs_mlops.mlops.registry import promote

    promote(version, force=force, say=click.echo)
    _show_production_link()


@registry.command("rollback")
def registry_rollback() -> None:
    """Swap production and previous back."""
    from dvfs_mlops.mlops.registry import rollback

    rollback(say=click.echo)
    _show_production_link()


@main.group()
def twin() -> None:
    """The simulated twin's board profiles."""


@twin.command("fit")
@click.option("--sweep-id", default="", help="Fit to this sweep's measured points (read from MLflow).")
@click.option("--experiment", default="dvfs-sweep", show_default=True, help="Where the sweep's runs are.")
@click.option("--csv", "csv_path", default=None, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Or fit to a CSV: workload (MODEL/TASK), freq_mhz, time_s and energy_j or power_w (CPU + GPU); optional steps "
                   "(default 1), batch_size (16), seq_len (the task's mean length), dtype.")
@TWIN_PROFILE_OPTION
@TWIN_PARAMS_OPTION
@click.option("--name", default="", help="The fitted profile's name (default fit-<sweep id or CSV name>).")
@click.option("--out", default="", metavar="FILE.yaml", help="Where to write the profile (default <name>.yaml here).")
@JSON_OPTION
def twin_fit(sweep_id: str, experiment: str, csv_path: str | None, twin_profile: str | None, twin_params: str | None, name: str,
             out: str, as_json: bool) -> None:
    """Fit a profile's timing and power constants to measured points; write it as YAML (loadable by --twin-params)."""
    from dvfs_mlops.app.twin_fit import fit_twin
    from dvfs_mlops.hw.twin.profiles import load_twin_params

    base = load_twin_params(twin_profile, twin_params)
    outcome = fit_twin(base, sweep_id=sweep_id or None, experiment=experiment, csv_path=csv_path, name=name or None, out=out or None,
                       say=_echo_err)
    if as_json:
        click.echo(json.dumps(outcome.to_dict(), indent=2))
        return
    r = outcome.result
    label = " (SIMULATED)" if outcome.simulated_input else ""
    click.echo(f"twin profile {r.params.profile}: fitted {base.profile} to {r.n_points} points of {r.n_workloads} workloads{label}")
    click.echo(f"{'quantity':<9} {'mean err':>9} {'max err':>9}   {'base mean':>9} {'base max':>9}")
    for q, e in r.errors.items():
        b = r.errors_before[q]
        click.echo(f"{q:<9} {100 * e.mean:8.2f}% {100 * e.max:8.2f}%   {100 * b.mean:8.2f}% {100 * b.max:8.2f}%")
    if r.errors_expected is not None:
        click.echo("against the points' noise-free values (SIMULATED): "
                   + ", ".join(f"{q} {100 * e.mean:.2f}% mean / {100 * e.max:.2f}% max" for q, e in r.errors_expected.items()))
    for k in r.fitted:
        click.echo(f"  {k:<24} {getattr(r.params, k):.6g}  (was {getattr(base, k):.6g})")
    click.echo(f"wrote {outcome.path}; use it with --twin-params {outcome.path}")


@main.command()
def restore() -> None:
    """Put back clocks that a killed run left pinned (applies its restore journal)."""
    from dvfs_mlops.hw import restore_journals

    restore_journals(announce=click.echo)


if __name__ == "__main__":  # pragma: no cover
    main()
