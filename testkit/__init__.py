"""Helpers shared by the tests and the benchmarks (fakes of the hardware, the twin's calibration targets,
synthetic boards). Not part of the installed package."""
