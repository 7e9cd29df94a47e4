"""Child process for guard tests: pin a clock on the fake tree, announce, then misbehave.

usage: python -m testkit.fakes.session_child FREQ raise|wait|exit
"""
from __future__ import annotations

import sys
import time

from dvfs_mlops.hw.jetson import JetsonDevice


def main() -> None:
    freq, action = sys.argv[1], sys.argv[2]
    with JetsonDevice().session(freq):
        print("PINNED", flush=True)
        if action == "raise":
            raise RuntimeError("boom inside the session")
        if action == "wait":
            time.sleep(60)
    print("RESTORED", flush=True)


if __name__ == "__main__":
    main()
