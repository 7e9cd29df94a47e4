"""testkit.calibration.fill_traces: processes filling one trace folder at once split the captures between them."""
from __future__ import annotations

import fcntl
import threading

from dvfs_mlops.hw.twin import trace as trace_module
from dvfs_mlops.hw.twin.trace import TraceCache, trace_key
from dvfs_mlops.job.workloads.zoo import PRESETS
from testkit.calibration import fill_traces


def test_a_trace_another_process_is_capturing_is_waited_for_and_read_not_captured_again(tmp_path, monkeypatch):
    config = PRESETS["bert-tiny"].config()
    shapes = [(config, 2, 8), (config, 2, 16)]
    captured: list[int] = []
    real_capture = trace_module.capture_step_trace

    def counting(config, batch_size, seq_len, *rest):
        captured.append(seq_len)
        return real_capture(config, batch_size, seq_len, *rest)

    monkeypatch.setattr(trace_module, "capture_step_trace", counting)
    other = TraceCache(tmp_path)  # "another process": holds the first shape's lock (an open file of its own)
    tmp_path.mkdir(exist_ok=True)
    lock = open(tmp_path / f"{trace_key(config, 2, 8, 'float32', 2)}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)

    def finish_then_release():
        while not (tmp_path / f"{trace_key(config, 2, 16, 'float32', 2)}.json").exists():  # this one takes the free shape
            threading.Event().wait(0.01)
        other.get(config, 2, 8)
        lock.close()  # the lock goes with its file

    helper = threading.Thread(target=finish_then_release)
    helper.start()
    fill_traces(TraceCache(tmp_path), shapes)
    helper.join(timeout=60)
    assert captured == [16, 8]  # the free shape first (here), the locked one by its holder; none twice
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(f"{trace_key(c, b, s, 'float32', 2)}.json" for c, b, s in shapes)
