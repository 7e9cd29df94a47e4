"""Several `train` processes on one Optuna study (distributed mode) against one process with the same total trials.

The data is the paper preset's twin curves (benchmarks/governor_quality.py: 12 models x 9 tasks, SIMULATED), the
training workloads with their curve-model fits as `train` searches them. For each
seed, the selection study of `train` (governor/search.py `select`: inner CV on the 36 characterisation workloads) runs
- once with N trials in one process, and
- with P processes x N/P trials on one shared RDB study (each process with `joined_sampler`, as `train --study-name` does).
Each study's best parameters are then refit on the characterisation workloads and judged on the 72 held-out eval-task
workloads (regret against the expected oracle). Figures: medians over seeds of the best inner regret and of the held-out
regret, and the wall time. Target: the shared study is as good (held-out regret within 0.05 points of one process).

usage: python -m benchmarks optuna   (DVFS_BENCH_OPTUNA_TRIALS, default 40; DVFS_BENCH_OPTUNA_PROCS, default 2;
DVFS_BENCH_OPTUNA_SEEDS, default 3; DVFS_BENCH_OPTUNA_STORAGE, an RDB URL, default a SQLite file in a temp folder;
a postgresql:// URL puts the studies in PostgreSQL)
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

_DATA: dict[str, Any] = {}


def _data() -> tuple[list[Any], list[Any], list[float]]:
    if not _DATA:
        from benchmarks.governor_quality import paper_dataset
        from dvfs_mlops.model.governor.dataset import with_fitted_curves

        ds = paper_dataset()
        _DATA["v"] = (with_fitted_curves(ds.split("train")).curves, ds.split("eval").curves, ds.frequencies)
    return _DATA["v"]


def _select(storage: str, name: str, trials: int, seed: int, worker: int | None) -> None:
    """One `train` process's selection on the shared study (a fork of the parent: the curves are already built)."""
    import optuna

    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import _create_study, choose_split, joined_sampler, select

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    train, _, freqs = _data()
    sampler = joined_sampler(seed, worker) if worker is not None else optuna.samplers.TPESampler(seed=seed)
    study = _create_study(storage, name, True, sampler)
    select(train, parse_objective("energy"), freqs, choose_split(train), trials, seed, study=study)


def _judge(storage: str, name: str, seed: int) -> tuple[float, float, int]:
    """(best inner regret, held-out regret of the refit best, trials) of a finished study."""
    import optuna

    from dvfs_mlops.model.governor.objectives import parse_objective
    from dvfs_mlops.model.governor.search import policy_fitter, score, study_params

    train, heldout, freqs = _data()
    study = optuna.load_study(study_name=name, storage=storage)
    energy = parse_objective("energy")
    best = study_params(study, train, seed)
    choose = policy_fitter(energy, best, freqs)(train)
    choices = {c.workload: choose(c) for c in heldout}
    return float(study.best_value), score(heldout, choices, energy).regret, len(study.trials)


def run() -> list[tuple[str, str, str]]:
    from dvfs_mlops.model.governor.search import storage_url

    trials = int(os.environ.get("DVFS_BENCH_OPTUNA_TRIALS", "40"))
    procs = int(os.environ.get("DVFS_BENCH_OPTUNA_PROCS", "2"))
    seeds = range(int(os.environ.get("DVFS_BENCH_OPTUNA_SEEDS", "3")))
    _data()  # built once, before the forks
    ctx = multiprocessing.get_context("fork")
    rows: dict[str, list[tuple[float, float, int, float]]] = {"one": [], "shared": []}
    with tempfile.TemporaryDirectory() as tmp:
        storage = storage_url(os.environ.get("DVFS_BENCH_OPTUNA_STORAGE") or f"sqlite:///{tmp}/optuna.db")
        for seed in seeds:
            for mode in ("one", "shared"):
                name = f"bench-{mode}-{seed}-{uuid.uuid4().hex[:6]}"
                t0 = time.perf_counter()
                if mode == "one":
                    p = ctx.Process(target=_select, args=(storage, name, trials, seed, None))
                    p.start()
                    p.join()
                    workers = [p]
                else:
                    workers = [ctx.Process(target=_select, args=(storage, name, trials // procs, seed, w)) for w in range(procs)]
                    for p in workers:
                        p.start()
                    for p in workers:
                        p.join()
                wall = time.perf_counter() - t0
                if any(p.exitcode != 0 for p in workers):
                    raise RuntimeError(f"a selection process failed ({mode}, seed {seed})")
                inner, held, n = _judge(storage, name, seed)
                rows[mode].append((inner, held, n, wall))

    def med(mode: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[mode])

    gap = med("shared", 1) - med("one", 1)
    return [
        ("trials per study (one / shared)", f"{med('one', 2):.0f} / {med('shared', 2):.0f}", f"{trials} each"),
        ("best inner regret, 1 process x N", f"{100 * med('one', 0):.3f} %", "-"),
        (f"best inner regret, {procs} processes x N/{procs}", f"{100 * med('shared', 0):.3f} %", "as good"),
        ("held-out regret (eval tasks), 1 x N", f"{100 * med('one', 1):.3f} %", "-"),
        (f"held-out regret (eval tasks), {procs} x N/{procs}", f"{100 * med('shared', 1):.3f} %", "within 0.05 points"),
        ("held-out gap, shared - one", f"{100 * gap:+.3f} points", "<= +0.05"),
        ("wall time, 1 x N / shared", f"{med('one', 3):.1f} s / {med('shared', 3):.1f} s", f"shared faster with {procs}+ cores"),
    ]
