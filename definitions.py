"""The code location: one Definitions object wiring assets, checks, resources and jobs."""

import dagster as dg

from assets import ALL_ASSETS, ALL_CHECKS, RUN_ASSETS, SWEEP_ASSETS, sweep_job, training_runs
from resources import LauncherResource, PlatformResource
from resources.alerts import AlertsResource
from sensors import ALL_SCHEDULES, ALL_SENSORS
from sensors.alerts import alert_sensor

snapshot_job = dg.define_asset_job(
    "dataset_snapshot_job", selection=dg.AssetSelection.assets("dataset_snapshot"), description="Build a snapshot."
)
training_pipeline = dg.define_asset_job(
    "training_pipeline",
    selection=dg.AssetSelection.assets(*RUN_ASSETS),
    partitions_def=training_runs,
    description="Train, checkpoint, evaluate and register one run (a training_runs partition).",
)

defs = dg.Definitions(
    assets=[*ALL_ASSETS, *SWEEP_ASSETS],
    asset_checks=ALL_CHECKS,
    jobs=[snapshot_job, training_pipeline, sweep_job],
    schedules=ALL_SCHEDULES,
    sensors=[*ALL_SENSORS, alert_sensor],
    resources={
        "platform": PlatformResource(),
        "launcher": LauncherResource(),
        "alerts": AlertsResource(),
    },
)
