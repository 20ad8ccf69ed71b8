"""The code location: one Definitions object wiring assets, checks, resources and jobs."""

import dagster as dg

from assets import ALL_ASSETS, ALL_CHECKS, SWEEP_ASSETS, sweep_job
from assets.jobs import snapshot_job, training_pipeline
from resources import LauncherResource, PlatformResource
from resources.alerts import AlertsResource
from sensors import ALL_SCHEDULES, ALL_SENSORS
from sensors.alerts import alert_sensor

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
