"""A board's power prior, fitted across the workloads of a sweep: what the others say about one workload.

Each workload's power is c (1 + k V(f)^2 f (s + (1 - s) u)) (curve.py): static power, plus dynamic
power that an idle GPU draws the share s of. The board fixes s and most of k; a workload's own
four clocks, each with ~2 % power noise, pin k poorly, and k alone (not c) moves the optimum. So:
- s: the idle share (on a grid) under which the workloads' fitted k agree best, i.e. the standard
  deviation of log k across workloads is least (as `curve.fit_voltage_shape` fits the voltage
  curve). s is a board constant: it is fitted once on all workloads;
- the prior for workload i: the median of log k over the OTHER workloads (leave one out: a
  workload's own noise never backs itself up), and their spread with each one's own fitting noise
  taken out (the spread of the estimates is the board's spread plus the noise of each fit: its
  variance, from the power noise per window and where the clocks were, is subtracted), plus the
  uncertainty of the median itself, under a floor.
A workload whose own k is not pinned at all (a power that does not change with the clock: k at the
end of its search range, or a fit deviation of log k above 0.5) says nothing about the board and is
left out of both. A board whose workloads really differ in k gets a wide prior, and each fit is then
its own.
Needs the GPU utilisation at every measured clock and at least `MIN_WORKLOADS` other workloads
with three or more clocks; otherwise there is no prior (None) and each workload is fitted on its own.
numpy only.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dvfs_mlops.hw.board import DEFAULT_NOISE, Board
from dvfs_mlops.model.curve import LOG_RATIO_BOUNDS, CurveFit, Measurement, PowerPrior, fit_curve, load_basis, power_ratio

MIN_WORKLOADS = 5  # other workloads a prior needs: fewer say too little about the board's spread
MIN_CLOCKS = 3  # a workload's own k is only told apart from its noise with a third clock
MIN_SPREAD = 0.03  # log k: no two workloads switch the same share of their power per cycle
IDLE_SHARES = tuple(round(0.05 * i, 2) for i in range(11))  # 0 .. 0.5 of the dynamic power while idle
MAX_FIT_SD = 0.5  # log k: a workload whose own fit is less sure than this tells nothing about the board

__all__ = ["MIN_CLOCKS", "MIN_WORKLOADS", "board_prior", "fit_idle_share", "leave_one_out_priors", "log_ratio", "sweep_fits", "usable"]


def usable(points: Sequence[Measurement]) -> bool:
    """Whether a workload's measurements can say something about the board's prior.

    Args:
        points: the workload's measurements.

    Returns:
        True for `MIN_CLOCKS` (3) or more distinct clocks with a finite GPU utilisation at every measurement.
    """
    return (len({round(m.freq_mhz, 3) for m in points}) >= MIN_CLOCKS
            and all(m.gpu_util is not None and math.isfinite(m.gpu_util) for m in points))


def log_ratio(points: Sequence[Measurement], idle_share: float, voltage_shape: float, f_max_mhz: float) -> float:
    """One workload's own log k: power = c (1 + k V(f)^2 f (s + (1 - s) u)) by least squares, no prior.

    Args:
        points: the workload's measurements, each with its GPU utilisation.
        idle_share: s.
        voltage_shape: r of the board's voltage curve.
        f_max_mhz: the top of the board's table.

    Returns:
        log k, within `curve.LOG_RATIO_BOUNDS`.
    """
    return _own_ratio(points, idle_share, voltage_shape, f_max_mhz, DEFAULT_NOISE[1])[0]


def _own_ratio(points: Sequence[Measurement], idle_share: float, voltage_shape: float, f_max_mhz: float,
               noise: float) -> tuple[float, float]:
    """One workload's own log k and its variance from the fit: power = c (1 + k x) has the relative
    sensitivities 1 to log c and k x / (1 + k x) to log k, each window `noise` (relative)."""
    f = np.asarray([m.freq_mhz for m in points], dtype=float)
    util = np.clip(np.asarray([m.gpu_util for m in points], dtype=float), 0.0, 1.0)
    load = load_basis(f, util, idle_share, voltage_shape, f_max_mhz)[:, 1]
    lk = power_ratio(load, np.asarray([m.power_w for m in points]))[0]
    kx = math.exp(lk) * load
    jac = np.column_stack([np.ones_like(kx), kx / (1.0 + kx)])
    try:
        var = float(np.linalg.inv(jac.T @ jac)[1, 1]) * noise ** 2
    except np.linalg.LinAlgError:
        var = math.inf
    return lk, var


def _informative(log_k: float, fit_var: float) -> bool:
    """A workload's own k that says something about the board: pinned, and not at the end of its search range."""
    lo, hi = LOG_RATIO_BOUNDS
    return fit_var <= MAX_FIT_SD ** 2 and lo + 0.05 < log_k < hi - 0.05


def fit_idle_share(workloads: Sequence[Sequence[Measurement]], voltage_shape: float, f_max_mhz: float,
                   noise: float = DEFAULT_NOISE[1]) -> float | None:
    """The board's idle share s: the one of `IDLE_SHARES` under which the workloads' own log k spread least.

    Only `usable` workloads count, and of those only the ones whose own k is pinned (a fit deviation of
    log k at most 0.5) and not at the end of its search range.

    Args:
        workloads: each workload's measurements.
        voltage_shape: r of the board's voltage curve.
        f_max_mhz: the top of the board's table.
        noise: the relative power noise of one measurement.

    Returns:
        s (the smaller of equal ones), or None where fewer than `MIN_WORKLOADS` workloads count under every share.
    """
    use = [w for w in workloads if usable(w)]
    if len(use) < MIN_WORKLOADS:
        return None
    spread: dict[float, float] = {}
    for s in IDLE_SHARES:
        ratios = [lk for lk, v in (_own_ratio(w, s, voltage_shape, f_max_mhz, noise) for w in use) if _informative(lk, v)]
        if len(ratios) >= MIN_WORKLOADS:
            spread[s] = float(np.std(ratios, ddof=1))
    return min(spread, key=lambda s: (spread[s], s)) if spread else None


def _prior(own: Sequence[tuple[float, float]], share: float) -> PowerPrior | None:
    """The prior the workloads' own (log k, its fit variance) make: their median, and their spread less the fits'
    noise plus the uncertainty of that median ((pi / 2) times a mean's variance, for a normal sample)."""
    kept = [(r, v) for r, v in own if _informative(r, v)]
    if len(kept) < MIN_WORKLOADS:
        return None
    ratios = np.asarray([r for r, _ in kept])
    fit_var = float(np.mean([v for _, v in kept]))
    board_var = max(0.0, float(np.var(ratios, ddof=1)) - fit_var)
    centre_var = math.pi / 2 * (board_var + fit_var) / len(kept)
    return PowerPrior(share, float(np.median(ratios)), max(MIN_SPREAD, math.sqrt(board_var + centre_var)), len(kept))


def leave_one_out_priors(workloads: Sequence[Sequence[Measurement]], *, voltage_shape: float, f_max_mhz: float,
                         noise: float = DEFAULT_NOISE[1]) -> list[PowerPrior | None]:
    """A prior for each workload of a sweep from the others (leave one out: its own noise never backs itself up).

    Args:
        workloads: each workload's measurements (the GPU utilisation at every clock, for those that count).
        voltage_shape: r of the board's voltage curve.
        f_max_mhz: the top of the board's table.
        noise: the relative power noise of one measurement (`Board.noise`'s second).

    Returns:
        One `PowerPrior` per workload, in order; None where fewer than `MIN_WORKLOADS` other workloads are usable
        and informative (every entry None where the idle share cannot be fitted).
    """
    share = fit_idle_share(workloads, voltage_shape, f_max_mhz, noise)
    if share is None:
        return [None] * len(workloads)
    own = [_own_ratio(w, share, voltage_shape, f_max_mhz, noise) if usable(w) else None for w in workloads]
    return [_prior([r for j, r in enumerate(own) if j != i and r is not None], share) for i in range(len(workloads))]


def board_prior(workloads: Sequence[Sequence[Measurement]], *, voltage_shape: float, f_max_mhz: float,
                noise: float = DEFAULT_NOISE[1]) -> PowerPrior | None:
    """The prior all the workloads of a sweep make together, for a workload the sweep never saw (refine at launch:
    the governor's version carries the one of the sweep it was trained on).

    Args:
        workloads: each workload's measurements.
        voltage_shape: r of the board's voltage curve.
        f_max_mhz: the top of the board's table.
        noise: the relative power noise of one measurement (`Board.noise`'s second).

    Returns:
        The `PowerPrior` (its `voltage_shape` and `f_max_mhz` left None), or None where fewer than `MIN_WORKLOADS`
        workloads are usable and informative.
    """
    share = fit_idle_share(workloads, voltage_shape, f_max_mhz, noise)
    if share is None:
        return None
    return _prior([_own_ratio(w, share, voltage_shape, f_max_mhz, noise) for w in workloads if usable(w)], share)


def sweep_fits(workloads: Sequence[Sequence[Measurement]], board: Board, repeats: int = 1) -> list[CurveFit | None]:
    """Every workload of a sweep fitted as the sweep predicts it (`predicted.csv`, `curve fit --sweep-id`): on the
    board's voltage shape and table top, at the noise of a mean of `repeats` runs, each workload's power curve
    leaning on the prior of all the others where there is one.

    Args:
        workloads: each workload's measured clocks, one `Measurement` per clock (repeats averaged, `mean_measurement`).
        board: the sweep's board (its record on the parent run).
        repeats: runs per measured clock.

    Returns:
        One `CurveFit` per workload, in order (`fit.prior` is the prior it leaned on, or None); None for a workload
        with fewer than two distinct clocks (an interrupted sweep's), which has no curve to fit.

    Raises:
        DvfsError: a workload's time or energy is not a finite number > 0.
    """
    noise = board.noise(repeats)
    priors = leave_one_out_priors(workloads, voltage_shape=board.voltage_shape, f_max_mhz=board.f_max_mhz, noise=noise[1])
    return [fit_curve(w, voltage_shape=board.voltage_shape, f_max_mhz=board.f_max_mhz, noise=noise, prior=prior)
            if len({round(m.freq_mhz, 3) for m in w}) >= 2 else None for w, prior in zip(workloads, priors)]
