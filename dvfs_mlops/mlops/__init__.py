"""MLOps: MLflow tracking, run records, sweeps, point claims, the governor's dataset, training, registry and
evaluation."""
