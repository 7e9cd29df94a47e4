"""The clock service's cost on a fake AGX Orin sysfs tree: restore latency after SIGKILL of a client, what a pin and a
restore through the service cost against writing directly (root), and what a member's meter pays per sample for the
measured clock the service relays. Needs root: the service runs as root and the killed clients are dropped to uid
65534 (testkit/fakes/clockd_client.py).

usage: python -m benchmarks clockd      (or: python -m benchmarks.clockd_latency [KILLS] [PINS])
"""
from __future__ import annotations

import grp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _service(base: Path, group: str) -> subprocess.Popen:
    from dvfs_mlops.hw.clockd.client import ClockdClient

    sock = base / "s.sock"
    proc = subprocess.Popen([sys.executable, "-m", "dvfs_mlops", "clockd", "serve", "--socket", str(sock), "--group", group],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            ClockdClient(sock).close()
            return proc
        except Exception:  # noqa: BLE001 - not listening yet
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the clock service did not start") from None
            time.sleep(0.02)


def _kill_latency(base: Path, fake, gid: int, tries: int) -> list[float]:
    """Seconds from SIGKILL of a pinned client to the devfreq range read back as it was."""
    found = fake.range_hz
    out = []
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-m", "testkit.fakes.clockd_client", "65534", "65534", str(gid), "session",
                                 "jetson", "408", "wait"], cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "PINNED"
        t0 = time.perf_counter()
        os.kill(proc.pid, signal.SIGKILL)
        while fake.range_hz != found:
            time.sleep(0.0002)
        out.append(time.perf_counter() - t0)
        proc.wait()
    return out


def _pin_restore(pin_factory, freqs: list[float], n: int) -> tuple[list[float], list[float]]:
    pins, restores = [], []
    for i in range(n):
        pin = pin_factory()
        t0 = time.perf_counter()
        pin.pin(freqs[i % len(freqs)])
        t1 = time.perf_counter()
        pin.restore()
        t2 = time.perf_counter()
        pins.append(t1 - t0)
        restores.append(t2 - t1)
    return pins, restores


def _relayed_clock(pin_factory, reads: int) -> list[float]:
    """Seconds per read of the clock the service measures (BPMP's GPC counters) for a pinned client: what a member's
    meter pays per sample."""
    pin = pin_factory()
    pin.pin(612.0)
    try:
        read = pin.measured_clock_reader()
        assert read is not None and read() == 612.0
        out = []
        for _ in range(reads):
            t0 = time.perf_counter()
            read()
            out.append(time.perf_counter() - t0)
        return out
    finally:
        pin.restore()


def run(kills: int = 20, pins: int = 50) -> list[tuple[str, str, str]]:
    if os.geteuid() != 0:
        return [("clock service benchmark", "skipped: needs root (the service runs as root)", "-")]
    from dvfs_mlops.hw.clockd.client import ServicePin
    from dvfs_mlops.hw.jetson import JetsonDevice, JetsonPin
    from testkit.fakes.sysfs import make_orin_tree, set_gpc_clock_hz

    group = "users"
    gid = grp.getgrnam(group).gr_gid
    base = Path(tempfile.mkdtemp(prefix="ckdb", dir="/tmp"))
    base.chmod(0o755)
    saved = dict(os.environ)
    service = None
    try:
        fake = make_orin_tree(base / "root", jetpack=6)
        set_gpc_clock_hz(fake.root, 612000000)  # BPMP's counters, which the service relays to members
        subprocess.run(["chmod", "-R", "a+rX", str(base / "root")], check=True)
        os.environ.update(DVFS_SYSFS_ROOT=str(fake.root), DVFS_SYSTEM_STATE_PREFIX=str(base / "system"),
                          DVFS_CLOCKD_SOCKET=str(base / "s.sock"))
        service = _service(base, group)
        freqs = [612.0, 816.0, 408.0]
        direct = _pin_restore(lambda: JetsonPin(JetsonDevice()), freqs, pins)
        served = _pin_restore(lambda: ServicePin("jetson", base / "s.sock"), freqs, pins)
        relayed = _relayed_clock(lambda: ServicePin("jetson", base / "s.sock"), 20 * pins)
        latency = _kill_latency(base, fake, gid, kills)
    finally:
        if service is not None:
            service.send_signal(signal.SIGTERM)
            service.wait(timeout=30)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(base, ignore_errors=True)

    def ms(xs: list[float]) -> str:
        return f"{1000 * statistics.median(xs):.2f} ms"

    return [
        (f"restore after SIGKILL of a client, median of {kills}", ms(latency), "< 1 s"),
        (f"restore after SIGKILL of a client, max of {kills}", f"{1000 * max(latency):.2f} ms", "< 1 s"),
        (f"pin through the service (connect + lock + journal + write + lease), median of {pins}", ms(served[0]), "-"),
        (f"pin as root, directly (lock + journal + write), median of {pins}", ms(direct[0]), "-"),
        (f"restore through the service (acknowledged), median of {pins}", ms(served[1]), "-"),
        (f"restore as root, directly, median of {pins}", ms(direct[1]), "-"),
        (f"measured GPU clock read through the service (a meter sample), median of {20 * pins}", ms(relayed),
         "< 2 ms (a 50 Hz meter)"),
    ]


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    for metric, value, target in run(*args):
        print(f"{metric}: {value} (target {target})")
