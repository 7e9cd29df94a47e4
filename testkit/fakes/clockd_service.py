"""The clock service with an in-process fake NVML (testkit/fakes/fake_pynvml.py): one GPU of the given UUID.

usage: python -m testkit.fakes.clockd_service SOCKET GROUP UUID

The service pins that GPU through the fake's nvmlDeviceSetGpuLockedClocks, which follows NVML's documented
behaviour; the fake GPU then reads its locked clock back (nvmlDeviceGetClockInfo), which the service reports in its
replies (`current_mhz`), so a test sees the lock and its reset from outside.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from dvfs_mlops.hw.clockd.server import ServiceConfig, serve
from testkit.fakes import fake_pynvml


def main() -> None:
    socket_path, group, uuid = sys.argv[1], sys.argv[2], sys.argv[3]
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    nvml = fake_pynvml.make_module([fake_pynvml.FakeGPU(uuid=uuid)])
    serve(ServiceConfig(Path(socket_path), group, nvml_module=nvml))


if __name__ == "__main__":
    main()
