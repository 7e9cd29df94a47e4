"""The frequency-picking model: dataset from a sweep, policies, Optuna search, pyfunc wrapper.

Nothing here imports torch: a governor is trained and served from MLflow runs alone.
"""
