"""The board power prior on synthetic boards whose workloads differ more or less (SIMULATED, not the twin).

The prior assumes a board's workloads share most of their dynamic-to-static power ratio k once their
GPU utilisation is accounted for. The twin's do (they differ only through the CPU's share), so the
twin alone cannot say what the prior costs where that assumption is wrong. Here each board has 14
workloads of the prior's own power form whose log k scatters by SPREAD around the board's; each
workload is measured adaptively (`curve.next_clock` without a prior, 1 %/2 % noise per window, start
816 MHz), and the predicted optimum of the plain per-workload fit and of the fit with the leave-one-out
prior are judged against the true curve (share within 0.2 % of the optimum; the same clocks and draws
for both, so the comparison is paired). The boards and their sweeps are testkit/boards.py's, shared with
tests/test_power_prior.py.
6 boards x 12 sweeps per spread (1008 draws; one standard error is about 0.6-0.8 points).
"""
from __future__ import annotations

import os

from testkit.boards import run_spread

SPREADS = (0.0, 0.03, 0.06, 0.1, 0.2)


def run() -> list[tuple[str, str, str]]:
    """One row per spread (DVFS_BENCH_PRIOR_SPREADS, comma-separated, else SPREADS): the share alone -> with the prior."""
    spreads = [float(x) for x in os.environ.get("DVFS_BENCH_PRIOR_SPREADS", ",".join(map(str, SPREADS))).split(",")]
    rows = []
    for s in spreads:
        alone, prior, n = run_spread(s)
        rows.append((f"synthetic boards, workloads' log k spread {s:g}: share within 0.2 %, each fit alone -> with the prior ({n} draws)",
                     f"{100 * alone:.1f} % -> {100 * prior:.1f} %", "- (what the prior costs where its assumption is off)"))
    return rows
