"""Helpers shared by the tests and the benchmarks (fakes of the hardware, the twin's calibration targets,
synthetic boards for the power prior, leave-one-workload-out CV) and the pytest plugin that ends a test run with
what was skipped (`skips.py`). Not part of the installed package; imports neither tests/ nor benchmarks/."""
