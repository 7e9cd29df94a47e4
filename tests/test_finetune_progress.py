"""Long fine-tuning shows its progress: a tqdm bar for the steps and one for the evaluation, on stderr, only while
stderr is a terminal; stdout (a command's `--json`) never carries it."""
from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import tqdm as tqdm_module

from tests.conftest import production_store


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (what `sys.stderr.isatty()` answers on a console)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def workload():
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    return prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=40)


@pytest.fixture
def bars(monkeypatch):
    """Every tqdm bar made while the test runs, as (desc, total, count when closed, disabled)."""
    made: list[tuple[str, int, int, bool]] = []

    class Recording(tqdm_module.tqdm):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._label = kwargs.get("desc", "")

        def close(self) -> None:
            if not getattr(self, "_recorded", False):
                self._recorded = True  # a disabled bar counts nothing: n stays 0
                made.append((self._label, self.total, self.n, self.disable))
            super().close()

    monkeypatch.setattr(tqdm_module, "tqdm", Recording)
    return made


def test_steps_and_evaluation_batches_are_counted_on_a_terminal(monkeypatch, workload, bars):
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune

    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    result = finetune(workload, FinetuneConfig(steps=6, batch_size=8, eval_batch_size=16))
    assert result.steps == 6
    # 40 dev examples in batches of 16: 3 batches
    assert bars == [("fine-tune bert-tiny/sst2", 6, 6, False), ("evaluate", 3, 3, False)]
    shown = err.getvalue()
    assert "fine-tune bert-tiny/sst2:" in shown and "evaluate:" in shown and "\r" in shown


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch, workload, bars):
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune

    err = io.StringIO()  # a pipe or a log file: isatty() is False
    monkeypatch.setattr(sys, "stderr", err)
    finetune(workload, FinetuneConfig(steps=3, batch_size=8))
    assert bars == [("fine-tune bert-tiny/sst2", 3, 0, True), ("evaluate", 1, 0, True)]  # 40 examples, batches of 64
    assert err.getvalue() == ""


def test_progress_false_silences_a_terminal_and_true_draws_on_a_pipe(monkeypatch, workload):
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune

    terminal, pipe = _Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    finetune(workload, FinetuneConfig(steps=2, batch_size=8), progress=False)
    assert terminal.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", pipe)
    finetune(workload, FinetuneConfig(steps=2, batch_size=8), progress=True)
    assert "fine-tune bert-tiny/sst2:" in pipe.getvalue()


def test_the_causal_lm_evaluation_has_its_bar(monkeypatch, bars):
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("pythia-14m", "instruct", train_size=32, dev_size=20)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    finetune(w, FinetuneConfig(steps=2, batch_size=8))
    # evaluate_lm batches at min(eval_batch_size, batch_size) = 8: 20 examples are 3 batches
    assert bars == [("fine-tune pythia-14m/instruct", 2, 2, False), ("evaluate", 3, 3, False)]


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every writer of the terminal closed it
            return
        if not chunk:
            return
        into.extend(chunk)


def test_finetune_json_keeps_stdout_json_while_the_terminal_shows_the_bar(tmp_path: Path, warm) -> None:
    """`finetune --json` as a user runs it in a terminal: the bar is drawn on the terminal (stderr), stdout is JSON."""
    env = {**os.environ, **production_store(tmp_path)}
    primary, secondary = pty.openpty()
    # a fresh pty is 0 columns wide, where tqdm draws nothing; a console window has a size
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    shown = bytearray()
    reader = threading.Thread(target=_drain, args=(primary, shown), daemon=True)
    reader.start()
    try:
        r = subprocess.run([warm.python, "-m", "dvfs_mlops", "finetune", "--model", "bert-tiny", "--task", "rte", "--device", "sim",
                            "--steps", "20", "--batch-size", "8", "--train-size", "64", "--probe-steps", "0", "--no-save-model", "--json"],
                           stdout=subprocess.PIPE, stderr=secondary, stdin=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path,
                           timeout=300)
    finally:
        os.close(secondary)
        reader.join(timeout=10)
        os.close(primary)
    terminal = shown.decode(errors="replace")
    assert r.returncode == 0, terminal[-3000:]
    summary = json.loads(r.stdout)  # the whole of stdout is the JSON document
    assert summary["workload"] == "bert-tiny/rte" and summary["metrics"]["energy_j"] > 0 and summary["simulated"] is True
    assert "fine-tune bert-tiny/rte:" in terminal and "evaluate:" in terminal
    assert "fine-tune" not in r.stdout and "\r" not in r.stdout

