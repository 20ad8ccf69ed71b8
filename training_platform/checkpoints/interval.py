"""`every_steps: auto`: the checkpoint interval from save cost and time between failures.

Young's first-order optimum is sqrt(2 * C * MTBF) seconds of work between checkpoints, C the
cost of one checkpoint to the training loop (for async saves: the stall, not the background
time) and MTBF the expected time between preemptions or failures. Daly's refinement
subtracts C, which matters when C is not small next to MTBF.
"""

from __future__ import annotations

import math


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
    young = math.sqrt(2.0 * cost * mtbf_seconds)
    seconds = young - cost if cost < 2.0 * mtbf_seconds else mtbf_seconds
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
