"""The clock service with an in-process fake NVML (testkit/fakes/fake_pynvml.py), for tests that need NVML GPUs or a
service under a descriptor limit. It serves Jetson too (the fake sysfs tree under $DVFS_SYSFS_ROOT), as the real one.

usage: python -m testkit.fakes.clockd_service SOCKET GROUP [--gpu UUID]... [--reset-delay S] [--lock-delay S]
                                              [--nofile N] [--max-lease S]

The service pins a GPU through the fake's nvmlDeviceSetGpuLockedClocks, which follows NVML's documented behaviour;
the fake GPU then reads its locked clock back (nvmlDeviceGetClockInfo), which the service reports in its replies
(`current_mhz`), so a test sees the lock and its reset from outside. `--reset-delay` makes every
nvmlDeviceResetGpuLockedClocks take that long, `--lock-delay` every nvmlDeviceSetGpuLockedClocks (a driver busy with
the GPU: how long either takes is not something NVML documents), so a test can signal the service mid-restore or
mid-pin. `--nofile` sets RLIMIT_NOFILE before the service starts, as systemd's LimitNOFILE= does (systemd.exec(5); the
unit sets 1024).
"""
from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dvfs_mlops.hw.clockd.config import ServiceConfig
from dvfs_mlops.hw.clockd.server import serve
from testkit.fakes import fake_pynvml


def _slow(call: Callable[..., object], delay: float) -> Callable[..., object]:
    def slow(*args: object) -> object:
        time.sleep(delay)
        return call(*args)

    return slow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("group")
    parser.add_argument("--gpu", action="append", default=[])
    parser.add_argument("--reset-delay", type=float, default=0.0)
    parser.add_argument("--lock-delay", type=float, default=0.0)
    parser.add_argument("--nofile", type=int, default=0)
    parser.add_argument("--max-lease", type=float, default=24 * 3600.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
    nvml = fake_pynvml.make_module([fake_pynvml.FakeGPU(uuid=u) for u in args.gpu]) if args.gpu else None
    if nvml is not None:
        for name, delay in (("nvmlDeviceResetGpuLockedClocks", args.reset_delay), ("nvmlDeviceSetGpuLockedClocks", args.lock_delay)):
            if delay:
                setattr(nvml, name, _slow(getattr(nvml, name), delay))
    serve(ServiceConfig(Path(args.socket), args.group, nvml_module=nvml, max_lease_s=args.max_lease))


if __name__ == "__main__":
    main()
