"""`dvfs-mlops calibrate`: check the request, open the device, then move another board's governor to it
(`mlops.calibration.calibrate_board`): a few measured points, a new version of this board's family, promoted if it
passes the gates."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from dvfs_mlops.app.devices import DeviceChoice, announcement, load_twin, open_chosen
from dvfs_mlops.app.links import version_link_lines

if TYPE_CHECKING:
    from dvfs_mlops.mlops.calibration import CalibrationOutcome, CalibrationRequest


@dataclasses.dataclass(frozen=True)
class CalibrateReport:
    """What `dvfs-mlops calibrate` did: the calibration's outcome, how its points were measured, and the MLflow UI link
    lines of the new version."""

    outcome: CalibrationOutcome
    label: str  # ' (SIMULATED)' on the twin, ' (REPLAYED)' on a measured grid, '' live
    link: list[str]

    def lines(self) -> list[str]:
        """The summary: source, what was measured, the version and whether it is production now."""
        o = self.outcome
        label = self.label
        resumed = f"{o.points_run} points measured" if o.points_run else "every point already measured (resumed)"
        status = (f"now production-{o.family}" if o.promoted
                  else f"not promoted: production-{o.family} stays v{o.kept} (--promote replaces it); promote it with: "
                       f"dvfs-mlops registry promote {o.version}" if o.kept is not None
                  else f"not promoted (--no-promote); promote it with: dvfs-mlops registry promote {o.version}")
        regret, source = 100 * o.metrics["calibration_regret"], 100 * o.metrics["calibration_source_regret"]
        return [(f"calibrated v{o.source_version} ({o.source_family}) for {o.family}{label}: {len(o.workloads)} workloads x "
                 f"{len(o.clocks_mhz)} clocks + maxn, {resumed}, sweep(s) {', '.join(o.sweep_ids)}"),
                f"calibration regret {regret:.2f}% on its workloads (the source as it is: {source:.2f}%){label}",
                f"dvfs-governor v{o.version}: {status}"]


def calibrate(request: CalibrationRequest, choice: DeviceChoice, say: Callable[[str], None] = lambda _m: None) -> CalibrateReport:
    """`dvfs-mlops calibrate`: check, open the device and its board, calibrate.

    Args:
        request: the source, the candidate preset, the steps, whether to promote.
        choice: the device to calibrate for.
        say: where the device line and the progress go.

    Returns:
        The `CalibrateReport`.

    Raises:
        DvfsError: an unknown preset, an unreachable store, a device that cannot be opened (all before any clock is
            touched), or as `calibrate_board`.
    """
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.calibration import calibrate_board, candidates

    twin = load_twin(choice)
    candidates(request.preset)  # a typo: at once
    tracking.check_reachable()  # before the device is even opened
    dev = open_chosen(choice, twin)
    board = board_of(dev, choice.torch_device or None)
    say(announcement(dev, choice))
    out = calibrate_board(dev, board, request, say=say)
    from dvfs_mlops.mlops.sweep.progress import device_label

    return CalibrateReport(out, device_label(board), version_link_lines(out.version))
