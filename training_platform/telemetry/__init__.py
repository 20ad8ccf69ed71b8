"""Telemetry: samplers (NVML or psutil), run figures, plots, alert rules, Prometheus, `tp doctor --bench`.

The worker side (`worker.py`) runs inside training processes and imports neither Dagster nor MLflow;
`alerts.py`, `records.py` and `status.py` are pure functions over run records.
"""
