"""The platform's daemon: its queue looks at its interval, not at Dagster's half-second steps; its sensors and
backfills look every few seconds, not every 5 and 30."""

from threading import Event

import pytest
from dagster._daemon import backfill as backfill_daemon
from dagster._daemon import controller
from dagster._daemon import sensor as sensor_daemon
from dagster._daemon.daemon import SpanMarker
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from training_platform_dagster.daemon import (
    BACKFILL_LOOK_SECONDS,
    SENSOR_LOOK_SECONDS,
    paced_core_loop,
    use_paced_queue,
    use_prompt_backfills,
    use_prompt_sensors,
)

INTERVAL = 0.7  # Dagster's loop would wait 0.5 + 0.5 after a look


class RecordingEvent(Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return super().wait(timeout)


class CountingDaemon(QueuedRunCoordinatorDaemon):
    looks = 0

    def run_iteration(self, workspace_process_context, fixed_iteration_time=None):
        self.looks += 1
        yield None


def test_the_wait_after_a_look_ends_at_the_interval_and_yields_every_half_second():
    daemon, shutdown = CountingDaemon(INTERVAL), RecordingEvent()
    loop = paced_core_loop(daemon, None, shutdown)
    yielded = []
    while daemon.looks < 2:
        yielded.append(next(loop))
    loop.close()
    assert yielded.count(SpanMarker.START_SPAN) == 2 and yielded.count(SpanMarker.END_SPAN) == 1
    assert shutdown.waits and sum(shutdown.waits) <= INTERVAL
    assert max(shutdown.waits) <= 0.5  # the controller writes heartbeats between yields
    end = yielded.index(SpanMarker.END_SPAN)
    between = yielded[end + 1 : yielded.index(SpanMarker.START_SPAN, end)]
    assert between == [None] * len(shutdown.waits)


class ShutdownDuringWait(RecordingEvent):
    def wait(self, timeout: float | None = None) -> bool:
        self.set()  # the controller stops while the loop waits
        return super().wait(timeout)


def test_a_shutdown_during_the_wait_ends_it_at_once():
    daemon, shutdown = CountingDaemon(60.0), ShutdownDuringWait()
    loop = paced_core_loop(daemon, None, shutdown)
    while next(loop) is not SpanMarker.END_SPAN:
        pass
    assert next(loop) is None
    assert next(loop) is SpanMarker.START_SPAN  # not another 59.5 s of waits: the controller stops here
    assert shutdown.waits == [0.5]


def test_the_queue_daemon_gets_the_paced_loop_and_a_loop_of_dagsters_own_is_not_replaced(monkeypatch):
    monkeypatch.setattr(QueuedRunCoordinatorDaemon, "core_loop", QueuedRunCoordinatorDaemon.core_loop)
    use_paced_queue()
    use_paced_queue()  # twice is once
    assert QueuedRunCoordinatorDaemon.core_loop is paced_core_loop

    def dagsters_own(self, workspace_process_context, shutdown_event):
        yield None

    monkeypatch.setattr(QueuedRunCoordinatorDaemon, "core_loop", dagsters_own)
    with pytest.raises(RuntimeError, match="update training_platform_dagster/daemon.py"):
        use_paced_queue()


@pytest.mark.parametrize(
    ("loop_module", "loop", "owner", "constant", "dagsters", "use", "ours"),
    [
        (sensor_daemon, "execute_sensor_iteration_loop", sensor_daemon, "MIN_INTERVAL_LOOP_TIME", 5,
         use_prompt_sensors, SENSOR_LOOK_SECONDS),
        (backfill_daemon, "execute_backfill_iteration_loop", controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", 30,
         use_prompt_backfills, BACKFILL_LOOK_SECONDS),
    ],
)
def test_the_sensor_and_backfill_daemons_look_every_few_seconds(
    monkeypatch, loop_module, loop, owner, constant, dagsters, use, ours
):
    monkeypatch.setattr(owner, constant, dagsters)  # Dagster's own pace
    use()
    # A fifth of Dagster's rest or less: a 5-s sensor ticks every 5 s, not every 10 s, and `tp retrain` waits seconds.
    assert getattr(owner, constant) == ours <= dagsters / 5

    def paced_otherwise(*args, **kwargs):
        yield None

    monkeypatch.setattr(loop_module, loop, paced_otherwise)
    with pytest.raises(RuntimeError, match="update training_platform_dagster/daemon.py"):
        use()
