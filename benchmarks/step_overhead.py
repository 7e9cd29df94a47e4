"""Instrumented vs bare fine-tune step time in one run (target <= 2 % overhead).

Bare: the fine-tune loop with no session. Instrumented: the same loop inside a metered session
with the 50 Hz power sampler running (a fake Jetson sysfs tree: the sampler thread does exactly the
reads it does on a board) and the per-step session hook. Interleaved A/B blocks, median of each.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path


def run(blocks: int = 6, steps: int = 20) -> list[tuple[str, str, str]]:
    from dvfs_mlops.device.jetson import JetsonDevice
    from dvfs_mlops.finetune import FinetuneConfig, finetune
    from dvfs_mlops.workloads.prepare import prepare_workload
    from tests.fakes.sysfs import make_orin_tree

    with tempfile.TemporaryDirectory() as tmp:
        fake = make_orin_tree(Path(tmp) / "root", jetpack=6)
        os.environ["DVFS_SYSFS_ROOT"] = str(fake.root)
        os.environ["DVFS_STATE_DIR"] = str(Path(tmp) / "state")
        w = prepare_workload("bert-mini", "mrpc", train_size=512, dev_size=16)
        cfg = FinetuneConfig(steps=steps)
        dev = JetsonDevice(sample_hz=50)

        def train(session):
            t0 = time.perf_counter()
            r = finetune(w.model_config, w.train, w.dev, w.encoder.pad_id, cfg, is_regression=False, session=session)
            return (time.perf_counter() - t0 - 0.0) / steps, r

        train(None)  # warm-up
        bare, inst = [], []
        for _ in range(blocks):
            bare.append(train(None)[0])
            s = dev.session(816)
            with s:
                inst.append(train(s)[0])
    b, i = statistics.median(bare), statistics.median(inst)
    return [
        ("bert-mini/mrpc step time, bare (CPU, includes eval)", f"{1e3 * b:.1f} ms", "-"),
        ("same, inside a metered session (50 Hz sampler + step hook)", f"{1e3 * i:.1f} ms", "-"),
        ("instrumentation overhead", f"{100 * (i / b - 1):+.2f} %", "<= 2 %"),
    ]
