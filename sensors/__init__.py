"""Sensors and schedules (preemption, run status, new data, retraining, sweeps)."""
