"""Speed, overhead and quality benchmarks (not tests). `python -m benchmarks [NAME ...]`."""
