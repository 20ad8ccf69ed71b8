"""Sensors and schedules: preemption, run status, new data, retraining, sweeps, checkpoint lifecycle."""

from sensors.checkpoint_lifecycle import checkpoint_lifecycle_schedule
from sensors.new_data import new_data_sensor
from sensors.preemption import preemption_sensor
from sensors.retraining import nightly_retraining, retraining_sensor
from sensors.run_status import training_failure_sensor
from sensors.sweep_windows import run_window_schedule, sweep_window_schedule
from sensors.sweeps import sweep_sensor

ALL_SENSORS = [preemption_sensor, training_failure_sensor, new_data_sensor, retraining_sensor, sweep_sensor]
ALL_SCHEDULES = [sweep_window_schedule, run_window_schedule, nightly_retraining, checkpoint_lifecycle_schedule]

__all__ = ["ALL_SCHEDULES", "ALL_SENSORS"]
