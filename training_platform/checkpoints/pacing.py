"""A background save's pace: its bytes spread over part of the time until the next save.

Written at full speed, a save competes with the training loop for memory bandwidth and the
disk, whatever its CPU priority: on two cores, steps of a 1 GB MLP took 1.3-1.8x as long while
its save ran unpaced (2.4 s), 1.15x with the save held to 200 MB/s (6 s) and 0.9-1.1x at
100 MB/s (11 s). The trainer knows its cadence (the time between its saves); the writer spreads each
save over PACE_FRACTION of it, at most MAX_PACE_SECONDS, so the checkpoint is still published
well before the next one is due. Whoever waits for a save (the run's end, a preemption, the
next save arriving early) hurries it: the rest is written at full speed.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from itertools import pairwise

PACE_FRACTION = 0.5
MAX_PACE_SECONDS = 60.0
"""A paced checkpoint is published later; a crash meanwhile loses that much more work."""
CADENCE_SAVES = 3
"""The pace follows the median of the last few gaps between saves."""


class SaveCadence:
    """Trainer side: when saves start, and from that the seconds the next one may be spread over."""

    def __init__(self) -> None:
        self._starts: deque[float] = deque(maxlen=CADENCE_SAVES + 1)

    def started(self, now: float) -> float:
        """A save starts at `now` (monotonic); returns its pace in seconds (0: unpaced, before a gap is known)."""
        self._starts.append(now)
        gaps = [later - earlier for earlier, later in pairwise(self._starts)]
        if not gaps:
            return 0.0
        return min(PACE_FRACTION * statistics.median(gaps), MAX_PACE_SECONDS)


class Pacer:
    """Writer side: hands out one save's bytes at a rate that spreads them over `seconds`.

    The writer tells it how many bytes the save holds (`plan`) before the first turn. Thread-safe:
    the writer's threads each wait for their chunk's turn, in turn.
    """

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self.rate = math.inf
        self.busy_seconds = 0.0
        """wall time during which at least one thread was working (not waiting for its turn)"""
        self.idle_seconds = 0.0
        """wall time during which a thread waited for its turn and none worked: the save only kept its pace"""
        self._next: float | None = None
        self._active = 0
        self._waiting = 0
        self._busy_since = 0.0
        self._idle_since = 0.0
        self._lock = threading.Lock()
        self._hurried = threading.Event()

    def plan(self, total_bytes: int) -> None:
        """The save holds `total_bytes`: spread them over the pacer's seconds. The first plan holds: a save
        planned as a whole (save_sharded: its DCP files and its weights) is not planned again by one part."""
        if self.seconds > 0 and total_bytes > 0 and self.rate == math.inf:
            self.rate = total_bytes / self.seconds

    @contextlib.contextmanager
    def turn(self, nbytes: int) -> Iterator[None]:
        """Wait until `nbytes` more may be written (at once when unpaced or hurried), then work."""
        waits = False
        if self.rate != math.inf and not self._hurried.is_set():
            with self._lock:
                now = time.monotonic()
                start = now if self._next is None else max(self._next, now)
                self._next = start + nbytes / self.rate
                waits = start > now
                if waits:
                    self._count(waiting=+1)
            if waits:
                self._hurried.wait(start - now)
        with self._lock:
            self._count(waiting=-1 if waits else 0, active=+1)
        try:
            yield
        finally:
            with self._lock:
                self._count(active=-1)

    def _count(self, *, waiting: int = 0, active: int = 0) -> None:
        """Under the lock: threads start or stop waiting or working. The save is busy while one works, and idles
        while some wait and none works."""
        busy, idle = self._active > 0, self._waiting > 0 and self._active == 0
        self._waiting += waiting
        self._active += active
        now = time.monotonic()
        if self._active > 0 and not busy:
            self._busy_since = now
        elif busy and self._active == 0:
            self.busy_seconds += now - self._busy_since
        now_idle = self._waiting > 0 and self._active == 0
        if now_idle and not idle:
            self._idle_since = now
        elif idle and not now_idle:
            self.idle_seconds += now - self._idle_since

    def hurry(self) -> None:
        """Someone waits for this save: write the rest at full speed."""
        self._hurried.set()

    @property
    def paced(self) -> bool:
        return self.rate != math.inf


class PaceControl:
    """Writer side: the pacer of the save being staged, and the trainer's 'hurry' for every save sent so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received = 0
        self._hurried_through = 0
        self._current: Pacer | None = None

    def received(self) -> int:
        """A save request arrived (in order); returns its number."""
        with self._lock:
            self._received += 1
            return self._received

    def hurry(self) -> None:
        """Every save received so far is waited for."""
        with self._lock:
            self._hurried_through = self._received
            if self._current is not None:
                self._current.hurry()

    def pacer(self, number: int, seconds: float) -> Pacer:
        """The pacer of save `number`, hurried already if the trainer waits for it."""
        pacer = Pacer(seconds)
        with self._lock:
            if number <= self._hurried_through:
                pacer.hurry()
            self._current = pacer
        return pacer
