"""`dvfs-mlops run`: any program under a pinned clock, metered, always restored."""
from __future__ import annotations

import shutil
import signal
import subprocess
from typing import Any

from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.meter import EnergyReport


def run_metered(device: Any, freq: str, command: list[str], observe: bool = False) -> tuple[int, EnergyReport]:
    """Run `command` (an argv list, never a shell string) inside a FreqSession (`observe`: meter only).

    SIGINT/SIGTERM reaching us are forwarded to the child; the session restores the clock on the
    way out whatever happens.
    """
    check_command(command)
    session = device.session(freq, observe=observe)
    with session:
        proc = subprocess.Popen(command)
        try:
            rc = proc.wait()
        except BaseException:
            _stop_child(proc)
            raise
    return (rc if rc >= 0 else 128 - rc), session.report()


def check_command(command: list[str]) -> None:
    if not command:
        raise DvfsError("no command given; usage: dvfs-mlops run --freq MHZ -- CMD ARGS...")
    if shutil.which(command[0]) is None:
        raise DvfsError(f"command not found: {command[0]}")


def _stop_child(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
