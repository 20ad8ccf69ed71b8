"""Stopping together: a preemption notice or a pruned trial, seen by any rank, stops every rank at one step.

The ranks agree through an all-reduce. One per step cost 6% of a small model's steps on CPU
(GPT tiny, 2 ranks: 45 -> 48 steps/s without it), so ranks agree every `interval` steps instead,
chosen so that a notice waits at most about CHECK_SECONDS of training and MAX_STEPS_BETWEEN_CHECKS
steps. On two busy cores a check took each rank 1.7-3 ms (waiting for the collective's thread to
be scheduled), so checking every 0.2 s (13 GPT-tiny steps) still cost 1-1.5% of the loop; a
second is a small part of any grace period (30 s and more). The step cap keeps runs of tiny
steps (tests, toy models) stopping within a few tenths of a second. The
interval comes from the slowest rank's step time, which the all-reduce itself carries: every
rank computes the same interval, so all of them reach the next check at the same step. Waiting
costs no work (the emergency checkpoint is taken at the step where they stop), only that much of
the grace period.
Sweep trials agree every step: a pruned trial's extra steps would be the sweep's wasted compute.
The same all-reduce carries the main rank's proposed checkpoint interval (`every_steps: auto`,
checkpoints/interval.py), so every rank adopts it at the same step.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from training_platform.train import distributed

CHECK_SECONDS = 1.0
MAX_STEPS_BETWEEN_CHECKS = 50


def steps_between_checks(step_seconds: float, check_seconds: float = CHECK_SECONDS) -> int:
    """How many steps fit in `check_seconds` at `step_seconds` per step (1 to MAX_STEPS_BETWEEN_CHECKS)."""
    fit = int(check_seconds / step_seconds) if step_seconds > 0 else 1
    return min(max(1, fit), MAX_STEPS_BETWEEN_CHECKS)


class Agreed(NamedTuple):
    stop: bool
    prune: bool
    checkpoint_every: float | None
    """the largest proposed checkpoint interval (0: none proposed); None when the ranks did not check"""


class StopAgreement:
    def __init__(self, info: distributed.DistInfo, every_step: bool = False):
        self.info = info
        self.every_step = every_step
        self.interval = 1
        self._steps = 0
        self._since: float | None = None  # the last check; the first poll checks at once and starts timing
        self.step_seconds = 0.0
        """the slowest rank's mean step time between the last two checks (0 until two checks)"""

    @property
    def checks_next(self) -> bool:
        """Whether the next poll is a check (the all-reduce)."""
        return self._steps + 1 >= self.interval

    def poll(self, stop: bool, prune: bool, checkpoint_every: float = 0.0) -> Agreed:
        """What all ranks agree on; call once per step on every rank."""
        self._steps += 1
        if self._steps < self.interval:
            if self.info.world_size == 1:  # nothing to agree on: a notice counts at once
                return Agreed(stop or prune, prune, None)
            return Agreed(False, False, None)
        now = time.perf_counter()
        step_seconds = (now - self._since) / self._steps if self._since is not None else 0.0  # 0: check every step
        any_stop, any_prune, slowest, every = distributed.max_over_ranks(
            [float(stop or prune), float(prune), step_seconds, checkpoint_every], self.info
        )
        self._steps, self._since = 0, now
        self.step_seconds = slowest
        if not self.every_step:
            self.interval = steps_between_checks(slowest)
        return Agreed(any_stop > 0, any_prune > 0, every)
