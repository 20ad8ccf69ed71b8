"""The platform's daemon: `dagster-daemon`, whose run queue looks for freed slots at its configured interval.

Dagster's queue daemon rests between looks in half-second waits (`IntervalDaemon.core_loop`), so a look is at
most every half second whatever `dequeue_interval_seconds` says, and a run waits a quarter of a second on average
after a slot of its team frees before it leaves the queue. Here the queue daemon rests exactly the rest of its
interval (the shipped 0.25 s): a look costs about 4 ms of one core, about 1.6 % of a core at that pace.

Dagster's sensor daemon looks for due sensors every 5 s and runs a sensor only when its minimum interval has passed
since its last tick began. A sensor of 5 s therefore ticks every 10 s: at the next look its 5 s have not quite
passed (the tick began a few milliseconds into the previous look). Here the sensor daemon looks every
SENSOR_LOOK_SECONDS, so each sensor ticks within that of its own interval: `tp train` and a sweep's next trials
wait on 5-s sensors. A look that finds no sensor due is one query of the sensors' states.

Dagster's backfill daemon looks for new and running backfills every 30 s, so `tp retrain` (a backfill of days)
waited up to 30 s before its first day was queued. Here it looks every BACKFILL_LOOK_SECONDS. It rests that long
after each look ends, as Dagster's does after its 30 s, so a look that takes long (a backfill of thousands of
partitions) still leaves the daemon idle between looks. Every other daemon is Dagster's, unchanged.

    python -m training_platform_dagster.daemon run -w workspace.yaml   (dagster-daemon's arguments)
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Iterator
from threading import Event
from types import ModuleType
from typing import Any

from dagster._daemon import backfill as backfill_daemon
from dagster._daemon import controller
from dagster._daemon import sensor as sensor_daemon
from dagster._daemon.daemon import IntervalDaemon, SpanMarker
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._utils.error import serializable_error_info_from_exc_info


def paced_core_loop(
    self: QueuedRunCoordinatorDaemon, workspace_process_context: Any, shutdown_event: Event
) -> Iterator[Any]:
    """IntervalDaemon.core_loop with one change: the wait after a look ends when the interval does, not at the end
    of a 0.5 s step.

    What it yields is what Dagster's loop yields (spans, errors, a None at least every half second between looks):
    the controller writes heartbeats and error reports from them.
    """
    while True:  # the controller stops the loop, as it stops Dagster's
        started = time.monotonic()
        yield SpanMarker.START_SPAN
        try:
            yield from self.run_iteration(workspace_process_context)
        except Exception:
            error_info = serializable_error_info_from_exc_info(sys.exc_info())
            self._logger.error("Caught error:\n%s", error_info)
            yield error_info
        yield SpanMarker.END_SPAN
        deadline = started + self.interval_seconds
        while (left := deadline - time.monotonic()) > 0 and not shutdown_event.is_set():
            shutdown_event.wait(min(left, 0.5))
            yield None


def use_paced_queue() -> None:
    """Make the queue daemon of every controller started from now on look at its interval."""
    if QueuedRunCoordinatorDaemon.core_loop not in (IntervalDaemon.core_loop, paced_core_loop):
        # A Dagster upgrade gave the queue daemon a loop of its own: fail loudly rather than replace it unread.
        raise RuntimeError(
            "this Dagster's queue daemon has its own core_loop; update training_platform_dagster/daemon.py for it"
        )
    QueuedRunCoordinatorDaemon.core_loop = paced_core_loop  # type: ignore[method-assign]


SENSOR_LOOK_SECONDS = 0.5
BACKFILL_LOOK_SECONDS = 5


def _set_pace(loop: Callable[..., Any], owner: ModuleType, constant: str, seconds: float) -> None:
    """Set OWNER.CONSTANT, which LOOP rests by after each look, to SECONDS."""
    if f"{constant} - loop_duration" not in inspect.getsource(loop):
        # A Dagster upgrade paces the loop otherwise: fail loudly rather than patch what no longer applies.
        raise RuntimeError(
            f"this Dagster's {loop.__name__} is paced otherwise; update training_platform_dagster/daemon.py for it"
        )
    setattr(owner, constant, seconds)


def use_prompt_sensors() -> None:
    """Make the sensor daemon look for due sensors every SENSOR_LOOK_SECONDS instead of every 5 s."""
    _set_pace(sensor_daemon.execute_sensor_iteration_loop, sensor_daemon, "MIN_INTERVAL_LOOP_TIME", SENSOR_LOOK_SECONDS)


def use_prompt_backfills() -> None:
    """Make the backfill daemon look every BACKFILL_LOOK_SECONDS instead of every 30 s.

    Its loop reads the controller's DEFAULT_DAEMON_INTERVAL_SECONDS when it starts. The only other reader is the
    asset daemon, for auto-materialize without sensors (`auto_materialize: use_sensors: false`), which the
    platform does not use.
    """
    _set_pace(backfill_daemon.execute_backfill_iteration_loop, controller, "DEFAULT_DAEMON_INTERVAL_SECONDS",
              BACKFILL_LOOK_SECONDS)


def main() -> None:
    use_paced_queue()
    use_prompt_sensors()
    use_prompt_backfills()
    from dagster._daemon.cli import main as daemon_main

    sys.argv = ["dagster-daemon", *sys.argv[1:]]
    sys.exit(daemon_main())


if __name__ == "__main__":
    main()
