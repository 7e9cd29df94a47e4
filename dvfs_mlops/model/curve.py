"""A per-workload curve model: time, power and energy at every clock from a few measured clocks.

Physically shaped, two parameters per curve, both non-negative:
    time(f)  = a + b / f                 (a fixed part, plus work that scales with the clock)
    power(f) = c + d * V(f)^2 * f        (static, plus dynamic CMOS power)
    energy(f) = time(f) * power(f)
V(f) is the board's voltage curve. Only its shape matters (d absorbs the scale), written as
V(f) ~ 1 + r * (f / f_max)^2 with r = v1 / v0; the twin's Orin curve (twin/params.py) gives r = 0.43,
and `fit_voltage_shape` fits r across the workloads of a sweep where the board's curve is unknown.

Both fits are least squares on RELATIVE residuals (run-to-run noise is multiplicative), under the
constraint a, b, c, d >= 0. The uncertainty is the usual one of a linear least-squares fit: the
parameter covariance from the residual variance (dof = clocks - 2), or from a stated relative noise
level when there are too few clocks to estimate it (`noise=`), propagated to each clock's prediction
and to energy assuming the time and power errors are independent. It says how well the fitted
shape is pinned by these measurements; it does not cover a board whose curves are not of this shape.
With a board prior (`PowerPrior`, fitted across a sweep's other workloads by power_prior.py) and
the GPU utilisation u measured at each clock, power is written as
    power(f) = c * (1 + k * V(f)^2 * f * (s + (1 - s) * u(f)))
(a GPU busy u of the time draws the full dynamic power, an idle one the share s of it), and the
ratio k of dynamic to static power, the only thing in the power curve that moves the optimum, is a
maximum a posteriori estimate under the board's spread of k across workloads: with 2 % power noise
per window, four clocks alone pin k poorly, and a board's workloads share most of it once their
different utilisations are accounted for. u at unmeasured clocks comes from a fit of GPU busy time,
busy(f) = alpha + beta / f, like time's.
Standard library and numpy only.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.board import DEFAULT_NOISE, ORIN_VOLTAGE_SHAPE

__all__ = [
    "LOG_RATIO_BOUNDS",
    "CurveFit",
    "CurvePoint",
    "Measurement",
    "PowerPrior",
    "fit_curve",
    "fit_voltage_shape",
    "load_basis",
    "mean_measurement",
    "next_clock",
    "power_ratio",
    "read_measurements_csv",
    "select_clocks",
]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measured clock: time and energy of the same work (power = energy / time).

    Attributes:
        freq_mhz: the clock.
        time_s: the time the work took.
        energy_j: the energy it drew.
        gpu_util: the GPU's busy share of that time (0..1), None where the meter did not read it.
        power_w: (property) `energy_j / time_s`.
    """

    freq_mhz: float
    time_s: float
    energy_j: float
    gpu_util: float | None = None

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s


def mean_measurement(freq_mhz: float, runs: Sequence[Measurement]) -> Measurement:
    """One clock's repeats as one measurement.

    Args:
        freq_mhz: the clock.
        runs: the repeats measured at it.

    Returns:
        A `Measurement` of the mean time and energy, and the mean GPU utilisation only where every repeat has
        one (a fit with a prior needs it at every clock), else None.

    Raises:
        DvfsError: `runs` is empty.
    """
    if not runs:
        raise DvfsError(f"no runs to average at {freq_mhz:g} MHz")
    utils = [m.gpu_util for m in runs if m.gpu_util is not None]
    util = sum(utils) / len(utils) if utils and len(utils) == len(runs) else None
    return Measurement(float(freq_mhz), sum(m.time_s for m in runs) / len(runs), sum(m.energy_j for m in runs) / len(runs), util)


@dataclasses.dataclass(frozen=True)
class PowerPrior:
    """What a board's other workloads say about one workload's power curve (power_prior.py fits it).

    Power = c (1 + k V(f)^2 f (s + (1 - s) u)), k the ratio of dynamic to static power.

    Attributes:
        idle_share: s, the share of dynamic power an idle GPU still draws (clock tree, leakage that follows the clock).
        log_ratio_mean: the centre of log k across the board's workloads (their median).
        log_ratio_sd: the spread of log k the prior allows (> 0).
        workloads: how many workloads it was fitted from.
        voltage_shape: the V(f) shape r the ratios were fitted with, set where the prior travels apart from its
            sweep (a governor version carries it to refine); else None.
        f_max_mhz: the table top the ratios were fitted with, set alongside `voltage_shape`; else None.
    """

    idle_share: float
    log_ratio_mean: float
    log_ratio_sd: float
    workloads: int
    voltage_shape: float | None = None  # the V(f) shape and table top the ratios were fitted with, where the prior
    f_max_mhz: float | None = None  # travels apart from its sweep (a governor version carries it to refine)

    def to_json(self) -> str:
        """The prior as a JSON object of its fields (keys sorted); `from_json` reads it back."""
        import json

        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PowerPrior:
        """The prior `to_json` wrote.

        Args:
            text: the JSON text (e.g. a governor version's `power_prior` tag).

        Returns:
            The `PowerPrior`; fields the text lacks take their defaults, keys that are not fields are ignored.

        Raises:
            DvfsError: the text is not a power prior (not JSON, a required field missing, a value that is not a
                finite number, a spread <= 0, an idle share outside 0..1 or a non-integer workload count).
        """
        import json

        try:
            data = json.loads(text)
            prior = cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})
            numbers = (prior.idle_share, prior.log_ratio_mean, prior.log_ratio_sd)
            optional = tuple(x for x in (prior.voltage_shape, prior.f_max_mhz) if x is not None)
            if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers + optional):
                raise ValueError("a value is not a finite number")
            if prior.log_ratio_sd <= 0 or not 0 <= prior.idle_share <= 1 or not isinstance(prior.workloads, int):
                raise ValueError("spread <= 0, idle share outside 0..1 or a non-integer workload count")
        except (ValueError, TypeError) as e:
            raise DvfsError(f"not a power prior ({e}): {text[:200]!r}") from None
        return prior


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """The model's prediction at one clock.

    Attributes:
        freq_mhz: the clock.
        time_s: predicted time.
        power_w: predicted power.
        energy_j: predicted energy (time x power).
        time_std_s: one standard deviation of `time_s` (module doc); None where the fit has no covariance.
        power_std_w: one standard deviation of `power_w`; None where the fit has no covariance.
        energy_std_j: one standard deviation of `energy_j` (time and power errors taken as independent); None where
            either is None.
        measured: the clock is one of the fit's measured clocks.
    """

    freq_mhz: float
    time_s: float
    power_w: float
    energy_j: float
    time_std_s: float | None = None
    power_std_w: float | None = None
    energy_std_j: float | None = None
    measured: bool = False

    def as_dict(self) -> dict[str, float | bool | None]:
        return dataclasses.asdict(self)


def _nnls2(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Weighted least squares of y ~ x @ beta with beta >= 0, for two columns; returns beta and the free columns."""
    xw, yw = x * w[:, None], y * w
    best: tuple[float, np.ndarray, list[int]] | None = None
    for cols in ([0, 1], [0], [1]):
        sub = xw[:, cols]
        beta_sub, *_ = np.linalg.lstsq(sub, yw, rcond=None)
        if np.any(beta_sub < 0):
            continue
        beta = np.zeros(2)
        beta[cols] = beta_sub
        rss = float(np.sum((yw - xw @ beta) ** 2))
        if best is None or rss < best[0] - 1e-15 * max(1.0, rss):
            best = (rss, beta, cols)
        if cols == [0, 1]:
            break  # the unconstrained optimum is feasible: it is the constrained one
    if best is None:
        return np.zeros(2), []
    return best[1], best[2]


@dataclasses.dataclass(frozen=True)
class _Linear:
    """y = beta . basis(f), with its covariance (None when it cannot be estimated)."""

    beta: np.ndarray
    cov: np.ndarray | None
    rel_sigma: float | None  # the relative residual scale used for the covariance

    def predict(self, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        y = basis @ self.beta
        if self.cov is None:
            return y, None
        var = np.einsum("ij,jk,ik->i", basis, self.cov, basis)
        return y, np.sqrt(np.maximum(var, 0.0))


def _fit_linear(basis: np.ndarray, y: np.ndarray, noise: float | None) -> _Linear:
    w = 1.0 / y
    beta, free = _nnls2(basis, y, w)
    n, k = len(y), len(free)
    rel_res = (y - basis @ beta) * w
    sigma: float | None = None
    if n > k > 0:
        sigma = float(math.sqrt(np.sum(rel_res ** 2) / (n - k)))
    if noise is not None:
        sigma = max(sigma or 0.0, noise)
    cov = None
    if sigma is not None and k > 0:
        xw = basis[:, free] * w[:, None]
        try:
            inv = np.linalg.inv(xw.T @ xw)
        except np.linalg.LinAlgError:
            inv = None
        if inv is not None:
            cov = np.zeros((2, 2))
            cov[np.ix_(free, free)] = sigma ** 2 * inv
    return _Linear(beta, cov, sigma)


@dataclasses.dataclass(frozen=True)
class CurveFit:
    """A fitted workload (`fit_curve` makes it): time = a + b/f, power = c + d V(f)^2 f (f in GHz inside); with
    `prior`, d multiplies V(f)^2 f (s + (1 - s) u(f)) instead, u from the `busy` fit (module doc).

    Attributes:
        measured: the measurements it was fitted to, by clock.
        a, b: time = a + b / f.
        c, d: power = c + d V(f)^2 f (with `prior`: c + d V(f)^2 f (s + (1 - s) u(f)), d = c k).
        voltage_shape: r of V(f) ~ 1 + r (f / f_max_mhz)^2.
        f_max_mhz: the table top V(f) is written against.
        prior: the board's power prior the power fit leaned on; None where it did not (no prior, or a measurement
            without its GPU utilisation).
        busy: GPU busy time = busy[0] + busy[1] / f (f in GHz), fitted with `prior`; else None.
    """

    measured: tuple[Measurement, ...]
    a: float
    b: float
    c: float
    d: float
    voltage_shape: float
    f_max_mhz: float
    _time: _Linear = dataclasses.field(repr=False)
    _power: _Linear = dataclasses.field(repr=False)
    prior: PowerPrior | None = None  # set when power was fitted with the board's prior and measured utilisation
    busy: tuple[float, float] | None = None  # GPU busy time = busy[0] + busy[1] / f (f in GHz), with `prior`

    def _util(self, time_basis: np.ndarray) -> np.ndarray:
        """Busy time over time at the basis' clocks (set only with `busy`)."""
        return np.clip((time_basis @ np.asarray(self.busy)) / (time_basis @ np.array([self.a, self.b])), 0.0, 1.0)

    def _bases(self, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bt = _time_basis(freqs)
        if self.prior is None or self.busy is None:
            return bt, _power_basis(freqs, self.voltage_shape, self.f_max_mhz)
        return bt, load_basis(freqs, self._util(bt), self.prior.idle_share, self.voltage_shape, self.f_max_mhz)

    def utilisation(self, frequencies_mhz: Sequence[float]) -> list[float] | None:
        """The GPU busy share the fit predicts at each clock.

        Args:
            frequencies_mhz: the clocks.

        Returns:
            The busy share (0..1) at each clock, in order; None where the fit has no `busy` curve (no prior used).
        """
        if self.busy is None:
            return None
        return [float(u) for u in self._util(_time_basis(np.asarray([float(x) for x in frequencies_mhz], dtype=float)))]

    def predict(self, frequencies_mhz: Sequence[float]) -> list[CurvePoint]:
        """Time, power and energy, with their standard deviations, at each clock.

        Args:
            frequencies_mhz: the clocks (any, not only the measured ones).

        Returns:
            One `CurvePoint` per clock, in order.
        """
        f = np.asarray([float(x) for x in frequencies_mhz], dtype=float)
        bt, bp = self._bases(f)
        t, t_sd = self._time.predict(bt)
        p, p_sd = self._power.predict(bp)
        e = t * p
        e_sd = None
        if t_sd is not None and p_sd is not None:
            e_sd = e * np.sqrt((t_sd / t) ** 2 + (p_sd / p) ** 2)
        seen = {round(m.freq_mhz, 3) for m in self.measured}
        return [CurvePoint(float(f[i]), float(t[i]), float(p[i]), float(e[i]),
                           None if t_sd is None else float(t_sd[i]), None if p_sd is None else float(p_sd[i]),
                           None if e_sd is None else float(e_sd[i]), round(float(f[i]), 3) in seen)
                for i in range(len(f))]

    def optimum(self, frequencies_mhz: Sequence[float]) -> CurvePoint:
        """The clock of the table with the lowest predicted energy.

        Args:
            frequencies_mhz: the table (non-empty).

        Returns:
            The `CurvePoint` of that clock (the first of equal ones).
        """
        return min(self.predict(frequencies_mhz), key=lambda pt: pt.energy_j)

    def gain(self, from_mhz: float, to_mhz: float) -> tuple[float, float]:
        """Predicted energy saved by moving from one clock to another, and its standard deviation.

        The deviation is that of the DIFFERENCE (delta method on both fits' parameter covariances):
        the two predictions share the fitted parameters, so it is much smaller than either one's own.

        Args:
            from_mhz: the clock moved from.
            to_mhz: the clock moved to.

        Returns:
            (E(from) - E(to), its standard deviation); a fit (time or power) without a covariance adds nothing to
            the deviation, so it is 0 when neither has one.
        """
        bt, bp = self._bases(np.asarray([float(from_mhz), float(to_mhz)]))
        t, p = bt @ self._time.beta, bp @ self._power.beta
        ut, up = p[0] * bt[0] - p[1] * bt[1], t[0] * bp[0] - t[1] * bp[1]
        var = 0.0
        for u, lin in ((ut, self._time), (up, self._power)):
            if lin.cov is not None:
                var += float(u @ lin.cov @ u)
        return float(t[0] * p[0] - t[1] * p[1]), math.sqrt(max(var, 0.0))

    def energy_residuals(self) -> list[float]:
        """Relative energy error of the fit at each measured clock (prediction / measurement - 1)."""
        pred = self.predict([m.freq_mhz for m in self.measured])
        return [pt.energy_j / m.energy_j - 1.0 for pt, m in zip(pred, self.measured)]


def _time_basis(f_mhz: np.ndarray) -> np.ndarray:
    g = f_mhz / 1000.0
    return np.column_stack([np.ones_like(g), 1.0 / g])


def _power_basis(f_mhz: np.ndarray, shape: float, f_max_mhz: float) -> np.ndarray:
    g = f_mhz / 1000.0
    v = 1.0 + shape * (f_mhz / f_max_mhz) ** 2
    return np.column_stack([np.ones_like(g), v * v * g])


def load_basis(f_mhz: np.ndarray, util: np.ndarray, idle_share: float, shape: float, f_max_mhz: float) -> np.ndarray:
    """The power basis [1, V(f)^2 f (s + (1 - s) u)] of the prior's model (see the module doc)."""
    basis = _power_basis(f_mhz, shape, f_max_mhz)
    basis[:, 1] *= idle_share + (1.0 - idle_share) * np.asarray(util, dtype=float)
    return basis


LOG_RATIO_BOUNDS = (-8.0, 6.0)  # log k: from practically all-static to practically all-dynamic power
_LOG_RATIO_GRID = np.linspace(*LOG_RATIO_BOUNDS, 561)


def power_ratio(load: np.ndarray, power: np.ndarray, *, sigma: float = 1.0, prior: tuple[float, float] | None = None) -> tuple[float, float]:
    """Fit power = c (1 + k load): least squares on relative residuals, or the maximum a posteriori log k.

    c is the closed-form least-squares scale for each k; log k is searched within `LOG_RATIO_BOUNDS` on
    a grid (step 0.025), then on a finer one (0.00125) between the best point's neighbours: two
    vectorised passes, as the priors fit every workload many times.

    Args:
        load: the load term at each measured clock (`load_basis`'s second column).
        power: the power measured there (W).
        sigma: the relative power noise the residuals are weighed at against the prior.
        prior: (mean, sd) of log k; None: plain least squares.

    Returns:
        (log k, c).
    """
    x, p = np.asarray(load, dtype=float), np.asarray(power, dtype=float)

    def objective(lk: np.ndarray | float) -> np.ndarray:
        g = (1.0 + np.exp(np.atleast_1d(lk))[:, None] * x[None, :]) / p[None, :]
        c = g.sum(axis=1) / (g * g).sum(axis=1)
        out = ((1.0 - c[:, None] * g) ** 2).sum(axis=1) / sigma ** 2
        if prior is not None:
            out = out + ((np.atleast_1d(lk) - prior[0]) / prior[1]) ** 2
        return out

    i = int(np.argmin(objective(_LOG_RATIO_GRID)))
    fine = np.linspace(_LOG_RATIO_GRID[max(i - 1, 0)], _LOG_RATIO_GRID[min(i + 1, len(_LOG_RATIO_GRID) - 1)], 41)
    lk = float(fine[int(np.argmin(objective(fine)))])
    g = (1.0 + math.exp(lk) * x) / p
    return lk, float(g.sum() / (g * g).sum())


def _fit_power_with_prior(f: np.ndarray, p: np.ndarray, util: np.ndarray, prior: PowerPrior, shape: float, fmax: float,
                          noise: float | None) -> _Linear:
    """Power = c + d load(f, u) with d = c k, log k a posteriori under the board's prior (module doc).

    The covariance of (c, d) is the linearised posterior's: the data's information plus the prior's on
    log(d / c); its residual scale has `noise` (or the default) as its floor, as `_fit_linear`'s."""
    basis = load_basis(f, util, prior.idle_share, shape, fmax)
    # the data are weighed against the prior at the stated noise (four residuals say little about it); the
    # covariance then uses the residuals' own scale where it is larger, as `_fit_linear` does
    sigma = noise if noise is not None else DEFAULT_NOISE[1]
    lk, c = power_ratio(basis[:, 1], p, sigma=sigma, prior=(prior.log_ratio_mean, prior.log_ratio_sd))
    beta = np.array([c, c * math.exp(lk)])
    w = 1.0 / p
    rel_res = (p - basis @ beta) * w
    if len(p) > 2:
        sigma = max(sigma, float(math.sqrt(np.sum(rel_res ** 2) / (len(p) - 2))))
    xw = basis * w[:, None]
    jac = np.array([-1.0 / beta[0], 1.0 / beta[1]])  # d log(d / c) / d(c, d)
    info = xw.T @ xw / sigma ** 2 + np.outer(jac, jac) / prior.log_ratio_sd ** 2
    try:
        cov: np.ndarray | None = np.linalg.inv(info)
    except np.linalg.LinAlgError:
        cov = None
    return _Linear(beta, cov, sigma)


def fit_curve(points: Sequence[Measurement], *, voltage_shape: float = ORIN_VOLTAGE_SHAPE, f_max_mhz: float | None = None,
              noise: tuple[float, float] | None = None, prior: PowerPrior | None = None) -> CurveFit:
    """Fit both curves to the measured clocks (at least two distinct ones).

    Args:
        points: the measurements, in any order.
        voltage_shape: r of the board's voltage curve V(f) ~ 1 + r (f / f_max)^2.
        f_max_mhz: the top of the board's table, which the voltage curve is written against (None: the highest
            measured clock).
        noise: (relative time noise, relative power noise): a floor under the residual scale, and the scale itself
            when there are too few clocks to estimate it. None: the residuals' own scale (a power fit with the prior
            weighs against the default noise instead), so a fit to two clocks has no covariance.
        prior: the board's power prior (module doc), used when every measurement carries its GPU utilisation.

    Returns:
        The `CurveFit`; its `prior` says whether the prior was used.

    Raises:
        DvfsError: fewer than two distinct clocks, or a time or energy that is not a finite number > 0.
    """
    pts = sorted(points, key=lambda m: m.freq_mhz)
    if len({round(m.freq_mhz, 3) for m in pts}) < 2:
        raise DvfsError(f"the curve model needs measurements at two or more distinct clocks, got {len(pts)}")
    for m in pts:
        if not (m.freq_mhz > 0 and m.time_s > 0 and m.energy_j > 0) or not all(map(math.isfinite, (m.freq_mhz, m.time_s, m.energy_j))):
            raise DvfsError(f"measurement at {m.freq_mhz:g} MHz has a non-positive or non-finite value "
                            f"(time_s={m.time_s!r}, energy_j={m.energy_j!r}); every clock needs time and energy > 0")
    f = np.asarray([m.freq_mhz for m in pts])
    fmax = float(f_max_mhz or f.max())
    t = np.asarray([m.time_s for m in pts])
    p = np.asarray([m.power_w for m in pts])
    tl = _fit_linear(_time_basis(f), t, None if noise is None else noise[0])
    util = [m.gpu_util for m in pts]
    if prior is not None and all(u is not None and math.isfinite(u) for u in util):
        u = np.clip(np.asarray(util, dtype=float), 0.0, 1.0)
        busy, _ = _nnls2(_time_basis(f), np.maximum(u * t, 1e-12 * t), 1.0 / t)
        pl = _fit_power_with_prior(f, p, u, prior, voltage_shape, fmax, None if noise is None else noise[1])
        return CurveFit(tuple(pts), float(tl.beta[0]), float(tl.beta[1]), float(pl.beta[0]), float(pl.beta[1]), voltage_shape, fmax, tl, pl,
                        prior, (float(busy[0]), float(busy[1])))
    pl = _fit_linear(_power_basis(f, voltage_shape, fmax), p, None if noise is None else noise[1])
    return CurveFit(tuple(pts), float(tl.beta[0]), float(tl.beta[1]), float(pl.beta[0]), float(pl.beta[1]), voltage_shape, fmax, tl, pl)


def fit_voltage_shape(workloads: Sequence[Sequence[Measurement]], f_max_mhz: float, grid: Sequence[float] | None = None) -> float:
    """The voltage-curve shape r that best explains the power of every workload of a sweep at once.

    A grid search over r (the fits are linear for a fixed r): the r with the least total relative
    power residual across workloads with at least three clocks.

    Args:
        workloads: each workload's measurements; those with fewer than three distinct clocks are left out.
        f_max_mhz: the top of the board's table.
        grid: the candidate values of r (None: 0 to 2 in steps of 0.02).

    Returns:
        The best r (the first of equal ones).

    Raises:
        DvfsError: no workload has three or more clocks.
    """
    usable = [sorted(w, key=lambda m: m.freq_mhz) for w in workloads if len({m.freq_mhz for m in w}) >= 3]
    if not usable:
        raise DvfsError("fitting the voltage curve needs at least one workload measured at three or more clocks")
    candidates = list(grid) if grid is not None else [i * 0.02 for i in range(101)]
    best_r, best_rss = candidates[0], math.inf
    for r in candidates:
        rss = 0.0
        for w in usable:
            f = np.asarray([m.freq_mhz for m in w])
            p = np.asarray([m.power_w for m in w])
            basis = _power_basis(f, r, f_max_mhz)
            beta, _ = _nnls2(basis, p, 1.0 / p)
            rss += float(np.sum(((p - basis @ beta) / p) ** 2))
        if rss < best_rss:
            best_r, best_rss = r, rss
    return float(best_r)


def read_measurements_csv(path: str) -> list[Measurement]:
    """Read measurements from a CSV file with a header row.

    Args:
        path: the file; its columns `freq_mhz`, `time_s` and `energy_j` (or `power_w` instead of `energy_j`; energy
            is then power x time), others ignored.

    Returns:
        One `Measurement` per row, in file order (no GPU utilisation).

    Raises:
        DvfsError: the file cannot be read, has no rows, lacks a column, or a row's value is not a number.
    """
    import csv

    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            columns = set(rows[0]) if rows else set()
    except OSError as e:
        raise DvfsError(f"cannot read {path}: {e.strerror or e}") from None
    if not rows:
        raise DvfsError(f"{path} has no rows; it needs the columns freq_mhz, time_s and energy_j (or power_w)")
    columns = {c.strip() for c in columns if c}
    lacking = [c for c in ("freq_mhz", "time_s") if c not in columns]
    if "energy_j" not in columns and "power_w" not in columns:
        lacking.append("energy_j (or power_w)")
    if lacking:
        raise DvfsError(f"{path} lacks the column(s) {', '.join(lacking)}; it has {', '.join(sorted(columns)) or 'none'}")
    out = []
    for i, raw in enumerate(rows, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        try:
            f_mhz, t = float(row["freq_mhz"]), float(row["time_s"])
            energy = float(row["energy_j"]) if row.get("energy_j") else float(row["power_w"]) * t
        except (KeyError, ValueError):
            raise DvfsError(f"{path} line {i}: freq_mhz, time_s and energy_j (or power_w) must be numbers, got {raw}") from None
        out.append(Measurement(f_mhz, t, energy))
    return out


def select_clocks(points: Sequence[Measurement], clocks: Sequence[float]) -> list[Measurement]:
    """The measurements at the given clocks.

    Args:
        points: the measurements.
        clocks: the clocks wanted (MHz); each matches the measurements within 0.5 MHz of it.

    Returns:
        Every matching measurement, clock by clock in the order of `clocks` (repeats included).

    Raises:
        DvfsError: a clock was not measured; the message lists the measured ones.
    """
    have = sorted({m.freq_mhz for m in points})
    chosen: list[Measurement] = []
    for c in clocks:
        hits = [m for m in points if abs(m.freq_mhz - c) <= 0.5]
        if not hits:
            raise DvfsError(f"clock {c:g} MHz was not measured; measured clocks: {', '.join(f'{f:g}' for f in have)}")
        chosen += hits
    return chosen


def _information(basis: np.ndarray, y: np.ndarray, noise: float) -> np.ndarray:
    """Fisher information of a relative-residual linear fit: sum of (basis / y)(basis / y)^T / noise^2."""
    xw = basis / y[:, None]
    return xw.T @ xw / noise ** 2


def _decision_variance(fit: CurveFit, freqs: np.ndarray, info_t: np.ndarray, info_p: np.ndarray) -> float:
    """Variance of the predicted energy differences between the fitted optimum and each table neighbour (summed),
    for the given information of the time and power fits (delta method, as `CurveFit.gain`)."""
    bt, bp = fit._bases(freqs)
    t, p = bt @ np.array([fit.a, fit.b]), bp @ np.array([fit.c, fit.d])
    try:
        ct, cp = np.linalg.inv(info_t), np.linalg.inv(info_p)
    except np.linalg.LinAlgError:
        return math.inf
    o = int(np.argmin(t * p))
    var = 0.0
    for j in (o - 1, o + 1):
        if 0 <= j < len(freqs):
            ut, up = p[o] * bt[o] - p[j] * bt[j], t[o] * bp[o] - t[j] * bp[j]
            var += float(ut @ ct @ ut + up @ cp @ up)
    return var


def next_clock(measured: Sequence[Measurement], table: Sequence[float], start_mhz: float, *, max_clocks: int = 4,
               voltage_shape: float = ORIN_VOLTAGE_SHAPE, noise: tuple[float, float] = DEFAULT_NOISE,
               prior: PowerPrior | None = None) -> float | None:
    """The clock an adaptive sweep measures next for one workload, or None when the optimum is pinned down.

    The start (the governor's choice), then the table's two ends (the leverage both fits need), then
    the clock whose measurement best pins the optimum: the one that leaves the least variance in the
    predicted energy differences between the fitted optimum and its two table neighbours (a c-optimal
    design on the linearised fits, with the board's per-window `noise`; it does not depend on what the
    measurement will read). That is often a clock next to an end (leverage on both fits' slopes), not
    the predicted optimum: with 1-2 % noise per window, one more draw at the optimum says less about
    which of two neighbours is cheaper than one more far from it. It stops early when the fit already
    puts both neighbours more than two standard deviations (of the difference) above the optimum.

    Args:
        measured: the workload's measurements so far (one per clock).
        table: the device's clock table.
        start_mhz: the first clock to measure (snapped to the nearest of the table).
        max_clocks: the most clocks measured for the workload.
        voltage_shape: r of the board's voltage curve.
        noise: (relative time noise, relative power noise) of one measurement.
        prior: the board's power prior, used where every measurement carries its GPU utilisation.

    Returns:
        The next clock, or None once `max_clocks` are measured, the optimum is pinned, or no clock is left.

    Raises:
        DvfsError: from `fit_curve`: a time or energy that is not a finite number > 0, or a table of one clock.
    """
    freqs = sorted(float(f) for f in table)
    have = sorted({round(m.freq_mhz, 3) for m in measured})
    if len(have) >= max_clocks:
        return None
    if not have:
        return min(freqs, key=lambda f: abs(f - start_mhz))
    for end in (freqs[-1], freqs[0]):
        if round(end, 3) not in have:
            return end
    fit = fit_curve(measured, voltage_shape=voltage_shape, f_max_mhz=freqs[-1], noise=noise, prior=prior)
    pred = fit.predict(freqs)
    o = min(range(len(freqs)), key=lambda i: pred[i].energy_j)
    if all(fit.gain(freqs[j], freqs[o])[0] > 2 * fit.gain(freqs[j], freqs[o])[1] > 0
           for j in (o - 1, o + 1) if 0 <= j < len(freqs)):
        return None
    f = np.asarray(freqs)
    mf = np.asarray([m.freq_mhz for m in measured])
    bt, bp = fit._bases(mf)
    info_t = _information(bt, np.asarray([m.time_s for m in measured]), noise[0])
    info_p = _information(bp, np.asarray([m.power_w for m in measured]), noise[1])
    cbt, cbp = fit._bases(f)
    best: tuple[float, float] | None = None
    for k, cand in enumerate(freqs):
        if round(cand, 3) in have:
            continue
        xt, xp = cbt[k] / pred[k].time_s, cbp[k] / pred[k].power_w
        v = _decision_variance(fit, f, info_t + np.outer(xt, xt) / noise[0] ** 2, info_p + np.outer(xp, xp) / noise[1] ** 2)
        if best is None or v < best[0]:
            best = (v, cand)
    return None if best is None else best[1]
