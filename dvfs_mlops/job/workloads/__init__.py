"""Workloads: model presets, GLUE tasks, and the features the governor sees."""
