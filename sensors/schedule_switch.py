"""Whether the platform's schedules start switched on.

They do by default: a deployment must retrain, collect checkpoints and release windowed runs without
anyone switching them on. `TP_SCHEDULES=off` starts them stopped (read when the code loads), for a
server whose work must not depend on the hour (the tests' servers) or a deployment being paused. A
schedule switched on or off in the UI keeps that state whatever this says.
"""

from __future__ import annotations

import os

import dagster as dg

from training_platform.errors import PlatformError

SCHEDULES_ENV = "TP_SCHEDULES"
_STATUS = {"on": dg.DefaultScheduleStatus.RUNNING, "off": dg.DefaultScheduleStatus.STOPPED}


def default_schedule_status() -> dg.DefaultScheduleStatus:
    value = os.environ.get(SCHEDULES_ENV, "on").strip().lower()
    if value not in _STATUS:
        raise PlatformError(f"{SCHEDULES_ENV}={value!r} is neither on nor off; set it to `on` (the default) or `off`")
    return _STATUS[value]
