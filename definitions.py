"""The code location: one Definitions object wiring assets, checks, resources and jobs."""

import dagster as dg

from assets import ALL_ASSETS, ALL_CHECKS, STORAGE_ASSETS, SWEEP_ASSETS, checkpoint_lifecycle_job, sweep_job
from assets.jobs import snapshot_job, training_pipeline
from resources import LauncherResource, PlatformResource
from resources.alerts import AlertsResource, webhook_from_environment
from sensors import ALL_SCHEDULES, ALL_SENSORS
from sensors.alerts import alert_sensor

defs = dg.Definitions(
    assets=[*ALL_ASSETS, *SWEEP_ASSETS, *STORAGE_ASSETS],
    asset_checks=ALL_CHECKS,
    jobs=[snapshot_job, training_pipeline, sweep_job, checkpoint_lifecycle_job],
    schedules=ALL_SCHEDULES,
    sensors=[*ALL_SENSORS, alert_sensor],
    executor=dg.in_process_executor,  # what the UI's Materialize runs too (see assets/jobs.py)
    resources={
        "platform": PlatformResource(),
        "launcher": LauncherResource(),
        "alerts": AlertsResource(webhook_url=webhook_from_environment()),
    },
)
