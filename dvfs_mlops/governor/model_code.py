"""The governor as an MLflow pyfunc, logged "from code" (no pickle).

MLflow copies this file and `policy_tree.py` (code_paths) into the model; `load_context` reads
the `policy` artifact (policy.json). Input columns: model_type, num_layers, hidden_size,
num_params, avg_seq_len, gpu_util_pct; output column freq_mhz, snapped to the caller's table when
`params={"frequencies": [...]}` is passed. Needs mlflow, pandas and the standard library.
"""
import json

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

try:
    import policy_tree  # shipped beside this file via code_paths
except ImportError:  # pragma: no cover - running from the source tree
    from dvfs_mlops.governor import policy_tree


class GovernorModel(PythonModel):
    def load_context(self, context):
        with open(context.artifacts["policy"]) as f:
            self.policy = json.load(f)

    def predict(self, context, model_input, params=None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        table = (params or {}).get("frequencies") or None
        freqs, paths = [], []
        for row in frame.to_dict(orient="records"):
            f, path = policy_tree.decide(self.policy, row)
            f = policy_tree.snap(f, table)
            freqs.append(f)
            paths.append(policy_tree.explain(path, f))
        return pd.DataFrame({"freq_mhz": freqs, "decision_path": paths})


mlflow.models.set_model(GovernorModel())
