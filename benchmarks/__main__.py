"""Run the benchmarks and write benchmarks/results/report.md.

usage: python -m benchmarks [SUITE ...]   (no SUITE: every one, in the order below; --help lists them)
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
    "governor": ("Governor quality on the paper preset, every built-in twin profile (SIMULATED)", "benchmarks.governor_quality"),
    "optuna": ("Distributed Optuna: P train processes on one study vs one process, same total trials (SIMULATED)",
               "benchmarks.distributed_optuna"),
    "measure_less": ("Measuring less: curve model, refine, adaptive sweep (SIMULATED)", "benchmarks.measure_less"),
    "prior": ("The board power prior on synthetic boards whose workloads differ (SIMULATED)", "benchmarks.prior_robustness"),
    "transfer": ("A governor moved to another board family from a few measured points (SIMULATED pairs; REAL A100/A40 rows)",
                 "benchmarks.transfer"),
    "curves": ("The curve model's fit error on public real-GPU clock sweeps (REAL)", "benchmarks.public_curves"),
    "clockd": ("Clock service: restore after SIGKILL, pin and restore overhead (fake Jetson sysfs, as root)",
               "benchmarks.clockd_latency"),
    "fleet": ("Workers sharing only a tracking server split one sweep: duplicated work (SIMULATED)", "benchmarks.fleet_split"),
    "real": ("Real measured grids replayed: curve error, adaptive regret, refine (REPLAYED)", "benchmarks.real"),
    "joint": ("Joint GPU/CPU/EMC search on the BoFL grid (REPLAYED)", "benchmarks.joint"),
    "twin_joint": ("The twin fitted on the BoFL grid: held-out error and picks (SIMULATED vs REPLAYED)", "benchmarks.twin_joint"),
}


def usage() -> str:
    """The help text: the command line and one line per suite."""
    width = max(map(len, SUITES))
    lines = [__doc__.strip().splitlines()[2], "", "suites:"]
    lines += [f"  {key:<{width}}  {title}" for key, (title, _) in SUITES.items()]
    lines += ["", "settings (environment variables DVFS_BENCH_*): see each suite's module docstring (python -m benchmarks.<module>)"]
    return "\n".join(lines)


def unknown_suites(names: list[str]) -> list[str]:
    """The names that are not suites, in the order given."""
    return [n for n in names if n not in SUITES]


def main(argv: list[str]) -> int:
    """Run the chosen suites (all without arguments), print their rows, write the report; 0 on success.

    `--help`/`-h` prints the suites; an unknown suite is one line on stderr naming the valid ones, exit 2."""
    import importlib

    if any(a in ("-h", "--help", "help") for a in argv):
        print(usage())
        return 0
    bad = unknown_suites(argv)
    if bad:
        print(f"unknown benchmark suite(s) {', '.join(bad)}; valid: {', '.join(SUITES)} (python -m benchmarks --help)",
              file=sys.stderr)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
