"""The job: what a workload is (`workloads/`), the metered fine-tuning loop, and probe-and-refine inside it."""
