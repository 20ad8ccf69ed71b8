"""TP_SCHEDULES: the platform's schedules start on, or stopped where a server must not depend on the hour."""

import dagster as dg
import pytest

from sensors.schedule_switch import default_schedule_status
from training_platform.errors import PlatformError


def test_schedules_start_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv("TP_SCHEDULES", raising=False)
    assert default_schedule_status() == dg.DefaultScheduleStatus.RUNNING
    monkeypatch.setenv("TP_SCHEDULES", "Off")
    assert default_schedule_status() == dg.DefaultScheduleStatus.STOPPED


def test_a_misspelt_switch_names_the_values_it_takes(monkeypatch):
    monkeypatch.setenv("TP_SCHEDULES", "false")
    with pytest.raises(PlatformError, match=r"TP_SCHEDULES='false'.*`on`.*`off`"):
        default_schedule_status()
