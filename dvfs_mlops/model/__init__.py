"""Models of the board and the workload: the per-workload curve model, the board's power prior, and the governor's
logic (features, objectives, policies, the tree search). numpy, scikit-learn and Optuna; no MLflow, no torch."""
