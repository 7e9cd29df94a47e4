"""`dvfs-mlops`: thin commands: parse (`options.py` builds each command's records), call one app function, print.

Errors a user can cause are `DvfsError`s: printed as one line on stderr, exit code 2, no traceback.
"""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from dvfs_mlops.app import options as opts
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.mlops.schema import SWEEP_EXPERIMENT

if TYPE_CHECKING:
    from dvfs_mlops.app.curve_fit import CurveFitRequest
    from dvfs_mlops.app.devices import DeviceChoice
    from dvfs_mlops.app.finetune_command import FinetuneJobRequest
    from dvfs_mlops.app.run import RunKnobs
    from dvfs_mlops.app.simulate import SimulateRequest
    from dvfs_mlops.app.sweep_command import SweepWorker
    from dvfs_mlops.mlops.calibration import CalibrationRequest
    from dvfs_mlops.mlops.evaluate import EvaluateRequest
    from dvfs_mlops.mlops.launch import LaunchOptions
    from dvfs_mlops.mlops.sweep import SweepRequest
    from dvfs_mlops.mlops.train import TrainRequest


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
            from dvfs_mlops.mlops.tracking import outage_line

            line = outage_line(e)
            if line is None:
                raise
            _one_line_error(line)
        sys.exit(rv if isinstance(rv, int) else 0)


def _one_line_error(message: str) -> None:
    click.echo("Error: " + " ".join(message.split()), err=True)
    sys.exit(2)


@click.group(cls=DvfsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dvfs-mlops")
def main() -> None:
    """Energy-optimal GPU clocks for on-device fine-tuning, as an MLOps pipeline."""
    from dvfs_mlops.app.startup import begin_command

    click.get_current_context().call_on_close(begin_command())


_echo_err = functools.partial(click.echo, err=True)


def _echo_lines(lines: Iterable[str], err: bool = False) -> None:
    for line in lines:
        click.echo(line, err=err)


@main.command()
@opts.device_options("device", "gpu_index", "trace")
@opts.JSON_OPTION
def devices(device: DeviceChoice, as_json: bool) -> None:
    """Show the backend, its frequency tables (GPU; CPU and memory where it has them), current clock and power rails."""
    from dvfs_mlops.app.devices import device_info, info_lines
    info = device_info(device, announce=None if as_json else _echo_err)
    _echo_lines([json.dumps(info.to_dict(), indent=2)] if as_json else info_lines(info))


@main.command()
@opts.simulate_options
@opts.device_options("twin_profile", "twin_params")
@opts.JSON_OPTION
def simulate(request: SimulateRequest, device: DeviceChoice, as_json: bool) -> None:
    """The simulated Orin's per-step time/power/energy curve for MODEL (SIMULATED)."""
    from dvfs_mlops.app.simulate import curve_lines, simulate_command

    result = simulate_command(request, device)
    _echo_lines([json.dumps(result, indent=2)] if as_json else curve_lines(result))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--freq", default="", help="Clock in MHz from the device's table, or 'maxn' (required unless --observe).")
@opts.knob_options
@opts.device_options("device", "sample_hz", "gpu_index", "assume_unlocked", "twin_profile", "twin_params", "device_id", "above_mode_cap")
@opts.OBSERVE_OPTION
@click.option("--all-gpus", is_flag=True, help="nvml: pin and meter every GPU from the start (default: the GPUs COMMAND uses).")
@opts.JSON_OPTION
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(freq: str, knobs: RunKnobs, device: DeviceChoice, observe: bool, as_json: bool, command: tuple[str, ...], **gpus: bool) -> int:
    """Pin the clocks (nvml: of the GPUs COMMAND uses, or --gpu-index's), run COMMAND (no shell), meter, restore; exit with its code."""
    from dvfs_mlops.app.run import run_command
    return run_command(freq, observe, device, command, say=_echo_err, **gpus, knobs=knobs, gpu_index_given=click.get_current_context()
                       .get_parameter_source("gpu_index") is not click.core.ParameterSource.DEFAULT).emit(as_json, click.echo)


@main.command()
@opts.sweep_options
@opts.device_options()
@opts.sweep_worker_options
@opts.JSON_OPTION
def sweep(request: SweepRequest, device: DeviceChoice, worker: SweepWorker, as_json: bool) -> None:
    """Fine-tune each workload at each clock (configuration); one MLflow run per point (resumable; several workers may share a sweep)."""
    from dvfs_mlops.app.sweep_command import run_sweep_command
    run_sweep_command(request, device, worker, say=_echo_err, with_best=as_json).emit(as_json, click.echo)


@main.command()
@opts.train_options
def train(request: TrainRequest) -> None:
    """Train the governor: Optuna picks a family (curve or classifier tree) and its hyper-parameters; nested CV reports held-out regret."""
    from dvfs_mlops.app.governor_commands import train as train_governor

    report = train_governor(request, say=_echo_err)
    _echo_lines([*report.lines(), *report.link])


@main.command("finetune")
@opts.finetune_job_options
@opts.launch_options
@opts.device_options()
@opts.JSON_OPTION
def finetune_cmd(job: FinetuneJobRequest, options: LaunchOptions, device: DeviceChoice, as_json: bool) -> None:
    """Fine-tune at the clock the production governor picks (metered, logged, always restored)."""
    from dvfs_mlops.app.finetune_command import finetune

    report = finetune(job, device, options, quiet=as_json, say=_echo_err)
    if as_json:
        click.echo(json.dumps(report.summary, indent=2, default=str))
    _echo_lines(report.link, err=as_json)


@main.command()
@opts.calibrate_options
@opts.device_options()
def calibrate(request: CalibrationRequest, device: DeviceChoice) -> None:
    """Move another board's governor to this board from at most 3 workloads x 4 clocks; promote it if it passes the gates."""
    from dvfs_mlops.app.calibrate import calibrate as calibrate_board

    report = calibrate_board(request, device, say=_echo_err)
    _echo_lines([*report.lines(), *report.link])


@main.group()
def curve() -> None:
    """The per-workload curve model: time, power and energy at every clock from a few measured ones."""


@curve.command("fit")
@opts.curve_fit_options
@opts.JSON_OPTION
def curve_fit(request: CurveFitRequest, as_json: bool) -> None:
    """Fit time = a + b/f and power = c + d V(f)^2 f on some clocks; predict every clock and the energy optimum."""
    from dvfs_mlops.app.curve_fit import fit_workload

    out = fit_workload(request, say=_echo_err)
    click.echo(json.dumps(out.to_json(), indent=2) if as_json else "\n".join(out.lines()))


@main.command("evaluate")
@opts.evaluate_options
@opts.JSON_OPTION
def evaluate_cmd(request: EvaluateRequest, as_json: bool) -> None:
    """Savings against MAXN and regret against the oracle (measured, and expected on the twin) with 95% intervals."""
    from dvfs_mlops.app.governor_commands import evaluate

    out = evaluate(request, say=_echo_err)
    click.echo(json.dumps(out.report.to_json(), indent=2) if as_json else out.table())
    _echo_lines(out.link, err=as_json)


@main.group()
def registry() -> None:
    """The governor in the MLflow Model Registry."""


@registry.command("list")
@click.option("--family", default="", help="Only the versions of this board family (e.g. jetson-orin-nano-8gb).")
@opts.JSON_OPTION
def registry_list(family: str, as_json: bool) -> None:
    """Versions with aliases, board family and held-out (nested CV) figures."""
    from dvfs_mlops.app.governor_commands import version_lines
    from dvfs_mlops.mlops.registry import list_versions

    versions = list_versions(family=family)
    _echo_lines([json.dumps(versions, indent=2, default=str)] if as_json else version_lines(versions))


@registry.command("show")
@click.argument("version")
def registry_show(version: str) -> None:
    """One version's tags, aliases and metrics (JSON): VERSION is a number, latest, or an alias (production, production-FAMILY)."""
    from dvfs_mlops.mlops.registry import show_version

    click.echo(json.dumps(show_version(version), indent=2, default=str))


@registry.command("bootstrap")
def registry_bootstrap() -> None:
    """Register the published tree (baselines/paper-mlg.json of the registry data) as a version."""
    from dvfs_mlops.app.governor_commands import bootstrap

    _echo_lines(bootstrap(say=click.echo))


@registry.command("promote")
@click.argument("version")
@click.option("--force", is_flag=True, help="Promote even if a gate fails.")
@click.option("--family", default="", help="The board family VERSION must belong to (default: whichever it is).")
def registry_promote(version: str, force: bool, family: str) -> None:
    """Check the gates of governor.yaml (the registry data), then alias VERSION as its board family's production."""
    from dvfs_mlops.app.governor_commands import promote

    _echo_lines(promote(version, force=force, say=click.echo, family=family))


@registry.command("rollback")
@click.option("--family", default="", help="The board family (default: the AGX Orin 64 GB's, what `production` means).")
def registry_rollback(family: str) -> None:
    """Swap a board family's production and previous back."""
    from dvfs_mlops.app.governor_commands import rollback

    _echo_lines(rollback(say=click.echo, family=family))


@main.group()
def twin() -> None:
    """The simulated twin's board profiles."""


@twin.command("fit")
@click.option("--sweep-id", default="", help="Fit to this sweep's measured points (read from MLflow).")
@click.option("--experiment", default=SWEEP_EXPERIMENT, show_default=True, help="Where the sweep's runs are.")
@click.option("--csv", "csv_path", default=None, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help=("Or a measured grid: workload (MODEL/TASK), gpu_mhz (MHz), time_s (s) and energy_j (J) of the same `steps` "
                    "training steps (default 1); optional batch_size, seq_len, dtype, cpu_mhz, emc_mhz (MHz), power_w (W), repeat."))
@opts.device_options("twin_profile", "twin_params")
@click.option("--name", default="", help="The fitted profile's name (default fit-<sweep id or CSV name>).")
@click.option("--out", default="", metavar="FILE.yaml", help="Where to write the profile (default <name>.yaml here).")
@click.option("--force", is_flag=True, help="Write the profile even where its energy or power error is above the base's or 10 %.")
@opts.JSON_OPTION
def twin_fit(sweep_id: str, experiment: str, csv_path: str | None, device: DeviceChoice, name: str, out: str, force: bool,
             as_json: bool) -> None:
    """Fit a profile's timing and power constants to measured points; write it as YAML (loadable by --twin-params)."""
    from dvfs_mlops.app.twin_fit import fit_twin_command
    outcome = fit_twin_command(device, sweep_id, experiment, csv_path, name, out, say=_echo_err, force=force)
    _echo_lines([json.dumps(outcome.to_dict(), indent=2)] if as_json else outcome.lines())


@main.command()
def restore() -> None:
    """Put back clocks that a killed run left pinned (applies its restore journals: GPU, CPU and memory clocks)."""
    from dvfs_mlops.hw import restore_journals
    restore_journals(announce=click.echo)


@main.command()
@click.argument("action", type=click.Choice(["serve", "install", "uninstall", "status", "release"]))
@opts.clockd_options
def clockd(action: str, options: opts.ClockdOptions) -> None:
    """The clock service, so group members pin clocks without root: serve, install/uninstall (root), status, release DEVICE (root)."""
    from dvfs_mlops.app.clockd_command import clockd_command
    _echo_lines(clockd_command(action, options, say=_echo_err))
