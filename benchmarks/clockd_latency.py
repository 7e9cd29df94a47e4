"""The clock service's cost on a fake AGX Orin sysfs tree: restore latency after SIGKILL of a client, what a pin and a
restore through the service cost against writing directly (root), what a pin and a restore of all three clock domains
(GPU, the CPU's three cpufreq policies, BPMP's EMC clock) cost against the GPU's alone, paired (each round pins both, in
alternating order), and what a member's meter pays per sample for the clocks the service relays. Needs root: the
service runs as root and the killed clients are dropped to uid 65534 (testkit/fakes/clockd_client.py).

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


POLICIES = ("policy0", "policy4", "policy8")


def _state(fake) -> tuple:
    """Every clock domain as it reads: the GPU's range, each CPU policy's, the EMC lock."""
    return fake.range_hz, tuple(fake.cpu_range_khz(p) for p in POLICIES), fake.emc_state()[0]


def _kill_latency(base: Path, fake, gid: int, tries: int, knobs: tuple[str, ...] = ()) -> list[float]:
    """Seconds from SIGKILL of a pinned client (of the GPU, or with `knobs` its CPU and EMC clocks too) to every domain
    read back as it was."""
    found = _state(fake)
    out = []
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-m", "testkit.fakes.clockd_client", "65534", "65534", str(gid), "session",
                                 "jetson", "408", "wait", *(("-", *knobs) if knobs else ())], cwd=ROOT, env=dict(os.environ),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "PINNED"
        t0 = time.perf_counter()
        os.kill(proc.pid, signal.SIGKILL)
        while _state(fake) != found:
            time.sleep(0.0002)
        out.append(time.perf_counter() - t0)
        proc.wait()
    return out


def _one(pin_factory, freq: float, knobs: dict[str, float]) -> tuple[float, float]:
    pin = pin_factory()
    t0 = time.perf_counter()
    pin.pin(freq, **knobs)
    t1 = time.perf_counter()
    pin.restore()
    return t1 - t0, time.perf_counter() - t1


def _pin_restore(pin_factory, freqs: list[float], n: int, knobs: tuple[dict[str, float], ...] = ({},)
                 ) -> list[tuple[list[float], list[float]]]:
    """Per set of knobs, (pin seconds, restore seconds) of `n` rounds; every round runs each set once, the sets in an
    order that alternates round by round, so the sets are paired against the same moments of a shared machine."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in knobs]
    for i in range(n):
        order = list(range(len(knobs)))
        if i % 2:
            order.reverse()
        for j in order:
            pin_s, restore_s = _one(pin_factory, freqs[i % len(freqs)], knobs[j])
            out[j][0].append(pin_s)
            out[j][1].append(restore_s)
    return out


def _relayed_clock(pin_factory, reads: int, with_emc: bool = False) -> list[float]:
    """Seconds per meter sample of the clocks the service reads for a pinned client: the GPU clock BPMP measures (GPC
    counters), and with `with_emc` the EMC rate too (one request serves both readers of a sample)."""
    pin = pin_factory()
    pin.pin(612.0)
    try:
        read = pin.measured_clock_reader()
        emc = pin.emc_reader() if with_emc else None
        assert read is not None and read() == 612.0 and (not with_emc or (emc is not None and emc() is not None))
        out = []
        for _ in range(reads):
            t0 = time.perf_counter()
            read()
            if emc is not None:
                emc()
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
        three = ({}, {"cpu_mhz": 1420.8, "emc_mhz": 2133.0})  # the GPU alone, then all three domains
        direct_gpu, direct_all = _pin_restore(lambda: JetsonPin(JetsonDevice()), freqs, pins, three)
        served_gpu, served_all = _pin_restore(lambda: ServicePin("jetson", base / "s.sock"), freqs, pins, three)
        relayed = _relayed_clock(lambda: ServicePin("jetson", base / "s.sock"), 20 * pins)
        relayed_emc = _relayed_clock(lambda: ServicePin("jetson", base / "s.sock"), 20 * pins, with_emc=True)
        latency = _kill_latency(base, fake, gid, kills)
        latency_all = _kill_latency(base, fake, gid, kills, ("1420.8", "2133"))
    finally:
        if service is not None:
            service.send_signal(signal.SIGTERM)
            service.wait(timeout=30)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(base, ignore_errors=True)

    def ms(xs: list[float]) -> str:
        return f"{1000 * statistics.median(xs):.2f} ms"

    def both(gpu: tuple[list[float], list[float]], every: tuple[list[float], list[float]]) -> str:
        """Pin + restore of the three domains against the GPU's alone: medians, and the median of the paired ratios."""
        g = [a + b for a, b in zip(*gpu)]
        e = [a + b for a, b in zip(*every)]
        return (f"{1000 * statistics.median(e):.2f} ms vs {1000 * statistics.median(g):.2f} ms GPU alone "
                f"(x{statistics.median(x / y for x, y in zip(e, g)):.2f} paired)")

    return [
        (f"restore after SIGKILL of a client, median of {kills}", ms(latency), "< 1 s"),
        (f"restore after SIGKILL of a client, max of {kills}", f"{1000 * max(latency):.2f} ms", "< 1 s"),
        (f"restore of all three domains after SIGKILL of a client, median of {kills}", ms(latency_all), "< 1 s"),
        (f"restore of all three domains after SIGKILL of a client, max of {kills}", f"{1000 * max(latency_all):.2f} ms",
         "< 1 s"),
        (f"pin through the service (connect + lock + journal + write + lease), median of {pins}", ms(served_gpu[0]), "-"),
        (f"pin as root, directly (lock + journal + write), median of {pins}", ms(direct_gpu[0]), "-"),
        (f"restore through the service (acknowledged), median of {pins}", ms(served_gpu[1]), "-"),
        (f"restore as root, directly, median of {pins}", ms(direct_gpu[1]), "-"),
        (f"pin + restore of GPU, CPU and EMC as root, directly, median of {pins}", both(direct_gpu, direct_all), "-"),
        (f"pin + restore of GPU, CPU and EMC through the service, median of {pins}", both(served_gpu, served_all), "-"),
        (f"measured GPU clock read through the service (a meter sample), median of {20 * pins}", ms(relayed),
         "< 2 ms (a 50 Hz meter)"),
        (f"GPU clock and EMC rate read through the service (a meter sample), median of {20 * pins}", ms(relayed_emc),
         "< 2 ms (a 50 Hz meter)"),
    ]


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    for metric, value, target in run(*args):
        print(f"{metric}: {value} (target {target})")
