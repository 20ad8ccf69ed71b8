"""Daily checkpoint lifecycle: pins from the registry, tiering, GC (`tp gc` does the same on demand)."""

import os

import dagster as dg

from assets.lifecycle import checkpoint_lifecycle_job
from sensors.schedule_switch import default_schedule_status
from training_platform.runs.specs import queue_tags

# Off-peak by default; TP_CHECKPOINT_LIFECYCLE_CRON overrides it (read when the code loads).
LIFECYCLE_CRON = os.environ.get("TP_CHECKPOINT_LIFECYCLE_CRON") or "30 3 * * *"

checkpoint_lifecycle_schedule = dg.ScheduleDefinition(
    name="checkpoint_lifecycle_schedule",
    cron_schedule=LIFECYCLE_CRON,
    execution_timezone="UTC",
    job=checkpoint_lifecycle_job,
    # On by default: otherwise storage only grows.
    default_status=default_schedule_status(),
    tags=queue_tags("platform", "low"),
    description=f"Every day ({LIFECYCLE_CRON} UTC): re-derive model pins, move old checkpoints to the cold tier, "
    "collect chunks no kept, pinned or in-flight checkpoint needs.",
)
