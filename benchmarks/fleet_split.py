"""Workers that share only an MLflow tracking server split one sweep (claims.TrackingClaims): the duplicated work.

A `mlflow server` over http on a SQLite store (127.0.0.1, a free port, a temporary folder), then for each worker count
N: N `dvfs-mlops sweep` processes started together on one profile-only twin sweep of 24 points (2 models x 3 tasks x
maxn + 3 clocks, SIMULATED), no --claims. Figures per N: points FINISHED more than once (target 0), point runs trained
and then lost to another worker's claim (KILLED with dvfs.claim_lost; their seconds are the training lost), claims
backed off from (the claim runs deleted) and the seconds those claim attempts took (each worker's own count, summed),
stale claims taken over, how the points split between the workers, and the wall time.

usage: python -m benchmarks fleet   (DVFS_BENCH_FLEET_WORKERS, default 3,8)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m", "--tasks", "sst2,mrpc,rte", "--freqs", "510,816,1300.5",
         "--steps", "0", "--profile-steps", "20", "--device", "sim"]
POINTS = 24
STATS = re.compile(r"claims through the tracking server: (\d+) back-off\(s\) \(([\d.]+) s\), (\d+) stale claim")


def _one(uri: str, workers: int) -> dict[str, object]:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    exp = f"fleet-split-{workers}w-{int(time.time())}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1", "DVFS_TORCH_DEVICE": "cpu"}
    env.pop("DVFS_CLAIMS_URI", None)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "dvfs_mlops", *SWEEP, "--experiment", exp], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(workers)]
    errs = [p.communicate(timeout=1800)[1] for p in procs]
    wall = time.perf_counter() - t0
    failed = [e[-500:] for p, e in zip(procs, errs) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} worker(s) failed: {failed[0]}")
    c = MlflowClient(tracking_uri=uri)
    e = c.get_experiment_by_name(exp)
    runs = c.search_runs([e.experiment_id], "tags.`dvfs.point` != ''", run_view_type=ViewType.ALL, max_results=10000)
    finished = Counter(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED" and r.info.lifecycle_stage == "active")
    lost = [r for r in runs if r.data.tags.get("dvfs.claim_lost") == "true"]
    stats = [m.groups() for err in errs for m in STATS.finditer(err)]
    split = Counter(r.data.tags.get("dvfs.claim_worker") for r in runs if r.info.status == "FINISHED")
    return {"workers": workers, "finished": sum(finished.values()), "distinct": len(finished),
            "twice": sum(n > 1 for n in finished.values()), "lost_runs": len(lost),
            "lost_s": sum(((r.info.end_time or 0) - r.info.start_time) / 1000 for r in lost),
            "deleted": sum(r.info.lifecycle_stage == "deleted" for r in runs),
            "backoffs": sum(int(b) for b, _s, _t in stats), "backoff_s": sum(float(s) for _b, s, _t in stats),
            "takeovers": sum(int(t) for _b, _s, t in stats), "split": sorted(split.values(), reverse=True), "wall_s": wall}


def run() -> list[tuple[str, str, str]]:
    sys.path.insert(0, str(REPO))
    from testkit.fakes.pgserver import MlflowServer

    counts = [int(n) for n in os.environ.get("DVFS_BENCH_FLEET_WORKERS", "3,8").split(",")]
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = MlflowServer(Path(tmp), f"sqlite:///{tmp}/server.db", start_timeout=300)
        try:
            for n in counts:
                r = _one(server.uri, n)
                rows += [
                    (f"{n} workers: points FINISHED (distinct of {POINTS})", f"{r['finished']} ({r['distinct']})", f"{POINTS} ({POINTS})"),
                    (f"{n} workers: points FINISHED twice", str(r["twice"]), "0"),
                    (f"{n} workers: runs trained then lost to another claim (their seconds)", f"{r['lost_runs']} ({r['lost_s']:.2f} s)", "0"),
                    (f"{n} workers: claims backed off (seconds those attempts took, all workers)",
                     f"{r['backoffs']} ({r['backoff_s']:.2f} s; {r['deleted']} claim runs deleted)", "small beside the wall time"),
                    (f"{n} workers: stale claims taken over", str(r["takeovers"]), "0 (no worker died)"),
                    (f"{n} workers: points per worker; wall time", f"{r['split']}; {r['wall_s']:.1f} s", "split between workers"),
                ]
        finally:
            server.stop()
    return rows


if __name__ == "__main__":
    for metric, value, target in run():
        print(f"{metric}: {value} (target {target})")
