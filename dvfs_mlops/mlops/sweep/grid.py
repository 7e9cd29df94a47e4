"""The grid strategy: every workload at every clock of the spec, every repeat, in one round (on hardware each
workload and repeat visits the clocks in its own seeded order, `SweepSpec.points`)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dvfs_mlops.mlops import tracking
from dvfs_mlops.mlops.sweep.progress import device_label
from dvfs_mlops.mlops.sweep.spec import Point, SweepSpec


class GridStrategy:
    """All of the spec's points, in one round."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self.points = spec.points()

    def expected_points(self) -> int:
        return len(self.points)

    def counted(self, done: set[str]) -> int:
        return sum(p.key in done for p in self.points)

    def describe(self, runner: Any) -> str:
        todo = len(self.points) - self.counted(runner.done)
        sim = device_label(runner.board)
        claimed = f"; points claimed in {runner.claims.kind}" if runner.claims.kind != "none" else ""
        return (f"sweep {self.spec.sweep_id}: {len(self.points)} points, {len(self.points) - todo} already finished, {todo} to run "
                f"on {runner.board.backend}{sim} {runner.board.device_id}; tracking {tracking.tracking_uri()}, experiment id "
                f"{runner.experiment_id}{claimed}")

    def rounds(self, runner: Any) -> Iterator[list[Point]]:
        yield self.points

    def finish(self, runner: Any) -> None:
        """Nothing beyond the sweep's own plots and summary."""
