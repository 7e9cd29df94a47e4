"""What "best clock" means: `energy` (default), `edp` (energy x time), `max-slowdown:X`."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from dvfs_mlops.errors import DvfsError

OBJECTIVES = ("energy", "edp", "max-slowdown:X")


@dataclasses.dataclass(frozen=True)
class Objective:
    kind: str  # energy | edp | max-slowdown
    max_slowdown: float | None = None

    @property
    def name(self) -> str:
        return f"max-slowdown:{self.max_slowdown:g}" if self.kind == "max-slowdown" else self.kind

    def costs(self, energy: Mapping[float, float], time: Mapping[float, float], maxn_time: float) -> dict[float, float]:
        """Cost of each clock; an infeasible clock (too slow) costs infinity."""
        if self.kind == "energy":
            return dict(energy)
        if self.kind == "edp":
            return {f: energy[f] * time[f] for f in energy}
        limit = self.max_slowdown * maxn_time  # type: ignore[operator]
        return {f: (energy[f] if time[f] <= limit * (1 + 1e-9) else math.inf) for f in energy}

    def best(self, energy: Mapping[float, float], time: Mapping[float, float], maxn_time: float) -> float:
        """The label: least cost; ties go to the higher clock (faster at equal cost)."""
        costs = self.costs(energy, time, maxn_time)
        feasible = {f: c for f, c in costs.items() if math.isfinite(c)}
        if not feasible:  # nothing meets the slowdown bound: the fastest clock is the closest
            return max(energy, key=lambda f: (-time[f], f))
        return min(feasible, key=lambda f: (feasible[f], -f))

    def regret(self, chosen: float, energy: Mapping[float, float], time: Mapping[float, float], maxn_time: float) -> float:
        """cost(chosen)/cost(oracle) - 1; an infeasible choice is charged the worst feasible cost, x2."""
        costs = self.costs(energy, time, maxn_time)
        oracle = costs[self.best(energy, time, maxn_time)]
        c = costs[chosen]
        if not math.isfinite(c):
            finite = [v for v in costs.values() if math.isfinite(v)]
            c = 2 * max(finite) if finite else energy[chosen]
            oracle = oracle if math.isfinite(oracle) else energy[self.best(energy, time, maxn_time)]
        return c / oracle - 1.0


def parse_objective(text: str) -> Objective:
    t = text.strip().lower()
    if t in ("energy", "edp"):
        return Objective(t)
    if t.startswith("max-slowdown:"):
        try:
            x = float(t.split(":", 1)[1])
        except ValueError:
            x = float("nan")
        if not x >= 1.0:
            raise DvfsError(f"objective {text!r}: X in max-slowdown:X must be a number >= 1 (e.g. max-slowdown:1.2)")
        return Objective("max-slowdown", x)
    raise DvfsError(f"unknown objective {text!r}; valid objectives: {', '.join(OBJECTIVES)}")
