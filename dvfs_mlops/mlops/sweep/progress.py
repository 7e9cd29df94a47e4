"""Progress of a sweep: tqdm on a terminal, one line per point through `say` otherwise (logs, CI)."""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dvfs_mlops.hw.board import Board

log = logging.getLogger(__name__)


def device_label(board: Board) -> str:
    """How a sweep's lines label what it measures: ' (SIMULATED)' on the twin, ' (REPLAYED)' on a measured grid, ''
    live."""
    if board.simulated:
        return " (SIMULATED)"
    return " (REPLAYED)" if board.backend == "replay" else ""


class Progress:
    """tqdm on a terminal; one line per point otherwise (logs, CI)."""

    def __init__(self, total: int, done: int, say: Callable[[str], None] | None = None):
        self.total, self.done = total, done
        self._say = say or log.info
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, unit="point", dynamic_ncols=True)

    def start(self, key: str) -> None:
        if self._bar is not None:
            self._bar.set_description(key)

    def finish(self, key: str, summary: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(summary)
        else:
            self._say(f"[{self.done}/{self.total}] {key}: {summary}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
