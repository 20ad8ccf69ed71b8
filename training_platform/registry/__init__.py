"""From a trained run to a registered model: evaluation, the promotion gate and MLflow's conventions.

`evaluate.py` evaluates a run's lineage-linked checkpoint on the held-out test split of its snapshot;
`script_evaluation.py` does it for a user's own script, in a process of its own; `champion.py` measures the current
champion again on the candidate's split, so the gate compares like with like; `tracking.py` holds MLflow's
conventions (required tags, lineage fields, the model registry, the gate and the `champion` alias).
"""
