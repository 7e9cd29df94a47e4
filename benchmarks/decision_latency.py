"""Governor decision latency: a cold process (resolve models:/...@production + load + predict) and a warm predict."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import median_of

COLD = r"""
import time, json
t0 = time.perf_counter()
from dvfs_mlops.registry import resolve
import pandas as pd
model, meta = resolve()
row = pd.DataFrame([{"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "num_params": 109000000,
                     "avg_seq_len": 71.3, "gpu_util_pct": 95.0}])
model.predict(row, params={"frequencies": [306.0, 612.0, 816.0, 1300.5]})
t1 = time.perf_counter()
for _ in range(200):
    model.predict(row, params={"frequencies": [306.0, 612.0, 816.0, 1300.5]})
print(json.dumps({"cold": t1 - t0, "warm": (time.perf_counter() - t1) / 200}))
"""


def run(repeats: int = 5) -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
        for args in (["registry", "bootstrap"], ["registry", "promote", "1"]):
            subprocess.run([sys.executable, "-m", "dvfs_mlops.cli", *args], env=env, check=True, capture_output=True)
        results = []

        def once() -> float:
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", COLD], env=env, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            d = json.loads(out.stdout.strip().splitlines()[-1])
            results.append((wall, d["cold"], d["warm"]))
            return wall

        median_of(once, repeats)
    results.sort()
    wall, cold, warm = results[len(results) // 2]
    return [
        ("decision, cold process (python start + imports + resolve + load + predict)", f"{wall:.2f} s", "before fine-tuning starts"),
        ("decision, in-process from first import to first prediction", f"{cold:.2f} s", "-"),
        ("decision, warm predict (one workload)", f"{1e3 * warm:.2f} ms", "-"),
    ]
