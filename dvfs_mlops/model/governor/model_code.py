"""The governor as an MLflow pyfunc, logged "from code" (no pickle).

MLflow copies this file and `policy_tree.py` (code_paths) into the model; `load_context` reads
the `policy` artifact (policy.json). Input columns: model_type, num_layers, hidden_size,
num_params, avg_seq_len, gpu_util_pct, and the optional trainable_params and precision; output columns freq_mhz and decision_path. Params:
`frequencies` (snap to the caller's clock table) and `objective` (energy | edp | max-slowdown:X,
applied at decision time by a curve governor; default: the one the version records).
Needs mlflow, pandas and the standard library.

`predict` is annotated with `pd.DataFrame`: MLflow 3 then neither warns about missing type hints
nor infers a schema from them (a DataFrame hint carries no columns), so the explicit signature
that `pyfunc.py` logs stays the one MLflow enforces before `predict` is called.
"""
import json
from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel, PythonModelContext

try:
    import policy_tree  # shipped beside this file via code_paths
except ImportError:  # pragma: no cover - running from the source tree
    from dvfs_mlops.model.governor import policy_tree


class GovernorModel(PythonModel):
    def load_context(self, context: PythonModelContext) -> None:
        with open(context.artifacts["policy"]) as f:
            self.policy = json.load(f)

    def predict(self, context: PythonModelContext, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        table = (params or {}).get("frequencies") or None
        objective = (params or {}).get("objective") or None
        return pd.DataFrame(policy_tree.decide_rows(self.policy, frame.to_dict(orient="records"), table, objective))


mlflow.models.set_model(GovernorModel())
