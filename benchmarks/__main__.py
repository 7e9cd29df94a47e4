"""Run the benchmarks and write benchmarks/results/report.md.

usage: python -m benchmarks [meter] [sim] ...
"""
from __future__ import annotations

import sys

from benchmarks.common import write_report

SUITES = {
    "meter": ("Meter CPU cost (fake Jetson sysfs)", "benchmarks.meter_cost"),
    "sim": ("Sim twin: capture and replay cost", "benchmarks.sim_replay"),
    "sweep": ("Sweep: MLflow overhead and quick preset", "benchmarks.sweep_overhead"),
    "decision": ("Governor decision latency", "benchmarks.decision_latency"),
    "overhead": ("Instrumented vs bare fine-tune step", "benchmarks.step_overhead"),
    "governor": ("Governor quality on the paper preset (SIMULATED)", "benchmarks.governor_quality"),
    "optuna": ("Distributed Optuna: P train processes on one study vs one process, same total trials (SIMULATED)",
               "benchmarks.distributed_optuna"),
    "measure_less": ("Measuring less: curve model, refine, adaptive sweep (SIMULATED)", "benchmarks.measure_less"),
    "prior": ("The board power prior on synthetic boards whose workloads differ (SIMULATED)", "benchmarks.prior_robustness"),
    "transfer": ("A governor moved to another board family from a few measured points (SIMULATED pairs; REAL A100/A40 rows)",
                 "benchmarks.transfer"),
    "clockd": ("Clock service: restore after SIGKILL, pin and restore overhead (fake Jetson sysfs, as root)",
               "benchmarks.clockd_latency"),
    "fleet": ("Workers sharing only a tracking server split one sweep: duplicated work (SIMULATED)", "benchmarks.fleet_split"),
}


def main(argv: list[str]) -> None:
    import importlib

    chosen = argv or list(SUITES)
    sections = []
    for key in chosen:
        title, module = SUITES[key]
        print(f"running {key} ...", flush=True)
        rows = importlib.import_module(module).run()
        for m, v, t in rows:
            print(f"  {m}: {v} (target {t})")
        sections.append((title, rows))
    print(f"report: {write_report(sections)}")


if __name__ == "__main__":
    main(sys.argv[1:])
