"""`every_steps: auto`: the checkpoint interval from save cost and time between failures.

Young's first-order optimum is sqrt(2 * C * MTBF) seconds of work between checkpoints, C the
cost of one checkpoint to the training loop and MTBF the expected time between preemptions or
failures. Daly's higher-order estimate (2006) corrects it where C is not small next to MTBF:
sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C for C < 2M, else M; it stays positive
where the first-order sqrt(2 C M) - C falls to zero (C near 2M).

C is taken as the save's stall plus its background time: where training keeps every core
busy, the background writer costs the loop about what it works, idle priority or not. On two
CPU cores, the eight steps after a 14 MB GPT-tiny save took 5-25 ms longer than others, and
2-16 ms with the writer's hashing skipped (an experiment). Where the background is free (GPU
nodes with idle cores) this overstates C; the interval then comes out longer by the square
root of that factor, and the optimum is flat (at twice the optimal interval the time lost is
25% above its minimum).
"""

from __future__ import annotations

import math
import statistics

SPOT_MTBF_SECONDS = 3600.0
ON_DEMAND_MTBF_SECONDS = 86400.0
FIRST_AUTO_STEPS = 50
"""With `auto`, steps between saves until a save's cost has been measured."""
COSTS_CONSIDERED = 5
REVISE_FRACTION = 0.2
"""A measured interval this much off the one in use replaces it; nearer ones are not worth a
change (the optimum is flat: 20% off it loses at most 2.5% more)."""
STEP_TIMES_CONSIDERED = 9


class IntervalChoice(int):
    """A number of steps (use it as an int) that remembers how it was chosen."""

    inputs: dict[str, float]

    def __new__(cls, steps: int, inputs: dict[str, float]) -> IntervalChoice:
        choice = super().__new__(cls, steps)
        choice.inputs = inputs
        return choice

    @property
    def steps(self) -> int:
        return int(self)

    def record(self) -> dict[str, float | int | str]:
        """Flat metadata for the run (Dagster metadata, MLflow params)."""
        return {"checkpoint_every_steps": int(self), "checkpoint_interval_rule": "young_daly", **self.inputs}


def young_daly_interval(
    save_seconds: float, mtbf_seconds: float, step_seconds: float, *, max_steps: int | None = None
) -> IntervalChoice:
    """Steps between checkpoints that minimise expected lost plus checkpointing time."""
    if save_seconds < 0 or mtbf_seconds <= 0 or step_seconds <= 0:
        raise ValueError(
            "young_daly_interval needs save_seconds >= 0, mtbf_seconds > 0 and step_seconds > 0; "
            f"got {save_seconds}, {mtbf_seconds}, {step_seconds}"
        )
    cost = max(save_seconds, 1e-6)
    if cost < 2.0 * mtbf_seconds:
        ratio = cost / (2.0 * mtbf_seconds)
        seconds = math.sqrt(2.0 * cost * mtbf_seconds) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost
    else:
        seconds = mtbf_seconds
    steps = max(1, round(seconds / step_seconds))
    if max_steps is not None:
        steps = min(steps, max(1, max_steps))
    inputs = {
        "checkpoint_save_seconds": float(save_seconds),
        "checkpoint_mtbf_seconds": float(mtbf_seconds),
        "checkpoint_step_seconds": float(step_seconds),
        "checkpoint_interval_seconds": round(steps * step_seconds, 3),
    }
    return IntervalChoice(steps, inputs)


class CheckpointCadence:
    """Which steps save: multiples of a fixed `every_steps`, or with `auto` the Young/Daly interval.

    Every rank holds one and all of them must save at the same steps. With `auto`, the main
    rank measures each save's cost and proposes an interval; the ranks' regular agreement
    (stopping.py) carries it to all of them at one step, so they adopt it together. Until a
    cost is measured, `auto` saves every FIRST_AUTO_STEPS steps.
    """

    def __init__(self, every_steps: int | str, max_steps: int, mtbf_seconds: float):
        self.auto = every_steps == "auto"
        self.every = FIRST_AUTO_STEPS if self.auto else int(every_steps)
        self.max_steps = max_steps
        self.mtbf_seconds = mtbf_seconds
        self.last_saved = 0
        self.choice: IntervalChoice | None = None
        """The interval this rank proposes (the main rank's latest, adopted at the ranks' next agreement)."""
        self.adopted: IntervalChoice | None = None
        """The interval the ranks save at (the main rank's record of it): what a run reports and its events say."""
        self._costs: list[float] = []
        self._costs_changed = False
        self._step_times: list[float] = []
        self._adopted = False

    def due(self, step: int) -> bool:
        if step == self.max_steps:
            return True
        if self.auto:  # the interval can change mid-run: count from the last save, not from step 0
            return step - self.last_saved >= self.every
        return step % self.every == 0

    def saved(self, step: int) -> None:
        """A save (or a restore) at `step`: the next one is counted from here."""
        self.last_saved = step

    def measured(self, cost_seconds: float) -> None:
        """One save's cost to the loop (main rank)."""
        self._costs.append(cost_seconds)
        del self._costs[:-COSTS_CONSIDERED]
        self._costs_changed = True

    def step_timed(self, step_seconds: float) -> None:
        """The ranks' step time over a stretch of steps (every rank, at each agreement)."""
        if step_seconds > 0:
            self._step_times.append(step_seconds)
            del self._step_times[:-STEP_TIMES_CONSIDERED]

    def proposal(self) -> float:
        """The interval in steps this rank proposes (0: none yet). It changes only after a save is
        measured, and uses the median of recent step times: a stretch with a save or an
        evaluation in it does not set the interval."""
        if self.auto and self._costs_changed and self._step_times:
            cost, step_seconds = statistics.median(self._costs), statistics.median(self._step_times)
            fresh = young_daly_interval(cost, self.mtbf_seconds, step_seconds, max_steps=self.max_steps)
            if self.choice is None or abs(fresh.steps - self.choice.steps) > REVISE_FRACTION * self.choice.steps:
                self.choice = fresh
            self._costs_changed = False
        return float(self.choice.steps) if self.choice is not None else 0.0

    def adopt(self, steps: float) -> bool:
        """Take the interval the ranks agreed on; True when it is the first or a different one."""
        if not self.auto or steps < 1 or (self._adopted and int(steps) == self.every):
            return False
        self.every, self._adopted = int(steps), True
        if self.choice is not None and self.choice.steps == self.every:
            self.adopted = self.choice
        return True
