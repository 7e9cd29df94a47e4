"""`dvfs-mlops finetune --device replay --trace FILE --task WORKLOAD --dry-run`: the launcher's decision on a replayed
workload, and what the grid says it would have cost.

A replay device runs nothing, so a fine-tune on it is a dry run or nothing: the governor of the grid's board family
(`launch.decide`, as for any job) decides on the workload's features from the file's feature columns
(`mlops.sweep.replayed.features_of_grid`), its utilisation the file's `gpu_util_pct` column; then the grid is looked
up at the decided configuration (a governor of configurations' CPU and EMC clocks with its GPU clock; a clock it leaves
open at the file's top) and at its top setting, so the line says what that decision saves on measurements (REPLAYED).
On a replay device `--task` names the grid's workload (the unit of work the grid measured is its only job).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from dvfs_mlops.app.devices import DeviceChoice, open_chosen
from dvfs_mlops.clocks import MAXN
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.replay import REPLAYED

if TYPE_CHECKING:
    from dvfs_mlops.hw.replay import ReplayDevice
    from dvfs_mlops.mlops.launch import LaunchOptions


def replay_dry_run(workload: str, model_named: bool, choice: DeviceChoice, options: LaunchOptions,
                   say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Decide on a replayed workload (nothing trains, nothing is logged) and look the decision up in the grid.

    Args:
        workload: the grid's workload (`--task`).
        model_named: the job named a model (--model, --model-config, --pretrained), which a grid's workload is not.
        choice: the replay device.
        options: the governor, strictness, other boards, refine, as for any fine-tune; `dry_run` must be set.
        say: where the decision lines go.

    Returns:
        The dry run's summary (`finetune --json`): the decision, the device, the workload, and `replayed`: the
        grid's energy and time of one unit of work at the decided configuration (its GPU, CPU and EMC clocks) and at its
        top setting, and the saving.

    Raises:
        DvfsError: a training fine-tune (no --dry-run), a model named, a workload not in the grid, no governor and
            refine off, or a governor that needs the utilisation the grid does not give.
    """
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.mlops.launch import decide
    from dvfs_mlops.mlops.sweep.replayed import features_of_grid

    if not options.dry_run:
        raise DvfsError("nothing to train on a replay device: it plays the measurements of a grid and runs nothing; add --dry-run "
                        "to see the decision on a replayed workload, or use --device jetson, nvml or sim")
    if model_named:
        raise DvfsError("a replayed grid names its own workloads: give one with --task WORKLOAD, without --model, --model-config "
                        "or --pretrained")
    dev = cast("ReplayDevice", open_chosen(choice, None, announce=say if options.announce_device else None))
    grid = dev.grid
    grid.check_workload(workload)
    board = board_of(dev)
    features = features_of_grid(grid, workload)

    def utilisation() -> tuple[float | None, str]:
        if features.gpu_util_pct is None:
            return None, "none: the grid has no gpu_util_pct column"
        return features.gpu_util_pct, "the grid's gpu_util_pct column"

    try:
        decision = decide(board, options, features, utilisation, say, device=dev)  # the file's CPU and EMC clocks
    except ValueError as e:  # a tree that splits on a feature the grid does not give
        raise DvfsError(f"the governor cannot decide on {workload!r} from {grid.path}: {e}; add that column to the grid") from None
    for line in decision.lines():
        say(line)
    chosen = dev.measure_setting(workload, dev.setting(decision.freq_mhz, decision.cpu_mhz, decision.emc_mhz))  # open: the top
    top = dev.measure(workload, MAXN)
    saving = 1.0 - chosen.energy_j / top.energy_j
    say(f"{REPLAYED}: {chosen.energy_j:.4g} J in {chosen.time_s:.4g} s per unit of work at {chosen.setting.label()}, against "
        f"{top.energy_j:.4g} J at the top setting ({top.setting.label()}): {100 * saving:.1f}% saved")
    say("dry run: stopping after the decision (nothing runs on a replay device)")
    return {"decision": decision.to_dict(), "device": board.backend, "device_profile": board.profile, "simulated": False,
            "workload": workload, "trace_sha256": grid.sha256, "trace_name": grid.name,
            "replayed": {"gpu_mhz": chosen.setting.gpu_mhz, "cpu_mhz": chosen.setting.cpu_mhz, "emc_mhz": chosen.setting.emc_mhz,
                         "energy_j": chosen.energy_j, "time_s": chosen.time_s,
                         "top_energy_j": top.energy_j, "top_time_s": top.time_s, "saving_vs_top": saving}}

