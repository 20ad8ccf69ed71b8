"""Young/Daly checkpoint interval, and the cadence that applies it during a run."""

from __future__ import annotations

import math

import pytest

from training_platform.checkpoints import CheckpointCadence, young_daly_interval
from training_platform.checkpoints.interval import FIRST_AUTO_STEPS


def _daly(cost: float, mtbf: float) -> float:
    ratio = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost


def test_interval_follows_young_daly_and_records_inputs():
    choice = young_daly_interval(save_seconds=2.0, mtbf_seconds=3600.0, step_seconds=0.5)
    assert choice == round(_daly(2.0, 3600.0) / 0.5) and isinstance(choice, int)
    assert abs(choice - (math.sqrt(2 * 2.0 * 3600.0) - 2.0) / 0.5) <= 2  # Young's, where the save is cheap
    record = choice.record()
    assert record["checkpoint_every_steps"] == choice.steps
    assert record["checkpoint_save_seconds"] == 2.0 and record["checkpoint_mtbf_seconds"] == 3600.0


def test_a_save_as_dear_as_twice_the_mtbf_does_not_make_every_step_save():
    # Young's sqrt(2CM) - C falls to 0 as C nears 2M (a save every step); Daly's estimate does not.
    near, beyond = young_daly_interval(0.399, 0.2, 0.001), young_daly_interval(0.4, 0.2, 0.001)
    assert near > 150 and beyond == 200


def test_cheaper_saves_or_more_failures_checkpoint_more_often():
    base = young_daly_interval(10, 3600, 1)
    assert young_daly_interval(1, 3600, 1) < base
    assert young_daly_interval(10, 600, 1) < base
    assert young_daly_interval(0, 3600, 1) >= 1
    assert young_daly_interval(10, 3600, 1, max_steps=50) == 50


@pytest.mark.parametrize("args", [(-1, 10, 1), (1, 0, 1), (1, 10, 0)])
def test_invalid_inputs_are_refused(args):
    with pytest.raises(ValueError, match="young_daly_interval"):
        young_daly_interval(*args)


def _saves(cadence: CheckpointCadence, steps: range) -> list[int]:
    """The steps that save, as the session (hooks.should_checkpoint) drives the cadence."""
    saved = []
    for step in steps:
        if cadence.due(step):
            cadence.saved(step)
            saved.append(step)
    return saved


def test_a_fixed_cadence_saves_at_multiples_and_at_the_last_step():
    cadence = CheckpointCadence(40, max_steps=130, mtbf_seconds=3600)
    cadence.saved(50)  # resumed from an emergency checkpoint at step 50: multiples still
    assert _saves(cadence, range(51, 131)) == [80, 120, 130]
    cadence.measured(5.0)
    cadence.step_timed(0.1)
    assert cadence.proposal() == 0.0 and not cadence.adopt(500)


def test_auto_saves_every_first_steps_until_a_save_is_measured_then_at_the_agreed_interval():
    cadence = CheckpointCadence("auto", max_steps=100_000, mtbf_seconds=3600)
    cadence.step_timed(0.1)
    assert cadence.proposal() == 0.0  # nothing measured: nothing to propose
    assert _saves(cadence, range(1, 2 * FIRST_AUTO_STEPS + 1)) == [FIRST_AUTO_STEPS, 2 * FIRST_AUTO_STEPS]
    cadence.measured(0.5)
    cadence.step_timed(0.9)  # one slow stretch (a save or an evaluation in it): the median ignores it
    cadence.step_timed(0.1)
    proposed = cadence.proposal()
    assert proposed == young_daly_interval(0.5, 3600, 0.1).steps
    cadence.step_timed(0.3)
    assert cadence.proposal() == proposed  # no new save measured: the proposal holds
    assert cadence.adopt(proposed) and not cadence.adopt(proposed)
    # Counted from the last save, not from step 0: the interval changed mid-run.
    start = 2 * FIRST_AUTO_STEPS
    assert _saves(cadence, range(start + 1, start + 2 * int(proposed) + 1)) == [
        start + int(proposed),
        start + 2 * int(proposed),
    ]
    cadence.step_timed(0.1)
    cadence.step_timed(0.1)  # the median step time is 0.1 s again
    cadence.measured(0.55)  # 10% dearer: the interval in use stays (not worth a change)
    assert cadence.proposal() == proposed
    cadence.measured(2.0)  # dearer saves from now on: the median of the last few decides
    cadence.measured(2.0)
    assert cadence.proposal() > proposed


def test_the_first_agreed_interval_counts_even_when_it_equals_the_first_one():
    cadence = CheckpointCadence("auto", max_steps=100_000, mtbf_seconds=3600)
    assert cadence.adopt(FIRST_AUTO_STEPS) and not cadence.adopt(FIRST_AUTO_STEPS)


def test_auto_saves_at_the_last_step_whatever_the_interval():
    cadence = CheckpointCadence("auto", max_steps=70, mtbf_seconds=3600)
    cadence.saved(20)  # resumed at step 20: the last step comes before the next interval ends
    cadence.measured(1.0)
    cadence.step_timed(0.01)
    assert cadence.adopt(cadence.proposal()) and cadence.every == 70
    assert _saves(cadence, range(21, 71)) == [70]
