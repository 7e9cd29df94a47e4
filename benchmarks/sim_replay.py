"""Cost of the twin: capturing a step trace on `meta`, and replaying one step at one clock."""
from __future__ import annotations

import time

from benchmarks.common import median_of


def run(repeats: int = 5) -> list[tuple[str, str, str]]:
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.params import OrinTwinParams
    from dvfs_mlops.hw.twin.physics import estimate_step
    from dvfs_mlops.hw.twin.trace import capture_step_trace
    from dvfs_mlops.job.workloads.zoo import PRESETS

    rows = []
    p = OrinTwinParams()
    capture_step_trace(PRESETS["bert-tiny"].config(), 16, 64)  # warm imports
    for name in ("bert-base", "pythia-1b"):
        cfg = PRESETS[name].config()

        def cap(cfg=cfg) -> float:
            t0 = time.perf_counter()
            capture_step_trace(cfg, 16, 64)
            return time.perf_counter() - t0

        cap_s, _ = median_of(cap, 3)
        trace = capture_step_trace(cfg, 16, 64)

        def replay(trace=trace) -> float:
            t0 = time.perf_counter()
            for _ in range(200):
                estimate_step(trace, 816.0, p)
            return (time.perf_counter() - t0) / 200

        rep_s, _ = median_of(replay, repeats)
        dev = SimDevice()

        def session_step(dev=dev, trace=trace) -> float:
            s = dev.session(816)
            with s:
                t0 = time.perf_counter()
                for _ in range(1000):
                    s.step(trace)
                return (time.perf_counter() - t0) / 1000

        step_s, _ = median_of(session_step, repeats)
        rows += [
            (f"{name}: trace capture on meta (b16, s64, {trace.n_kernels} kernels)", f"{cap_s:.2f} s", "seconds"),
            (f"{name}: replay one step at one clock (queue + rails)", f"{1e3 * rep_s:.3f} ms", "-"),
            (f"{name}: SimSession.step() per training step (curve memoised)", f"{1e6 * step_s:.1f} us", "-"),
        ]
    return rows
