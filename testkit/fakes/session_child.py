"""Child process for guard tests: pin a clock (and the CPU and memory clocks where given) on the fake tree, announce,
then misbehave.

usage: python -m testkit.fakes.session_child FREQ raise|wait|exit [CPU_MHZ|- [EMC_MHZ|-]]
"""
from __future__ import annotations

import sys
import time

from dvfs_mlops.hw.jetson import JetsonDevice


def main() -> None:
    freq, action = sys.argv[1], sys.argv[2]
    knobs = {k: float(v) for k, v in zip(("cpu_mhz", "emc_mhz"), sys.argv[3:5]) if v != "-"}
    with JetsonDevice().session(freq, **knobs):
        print("PINNED", flush=True)
        if action == "raise":
            raise RuntimeError("boom inside the session")
        if action == "wait":
            time.sleep(60)
    print("RESTORED", flush=True)


if __name__ == "__main__":
    main()
