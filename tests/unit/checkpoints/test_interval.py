"""Young/Daly checkpoint interval."""

from __future__ import annotations

import math

import pytest

from training_platform.checkpoints import young_daly_interval


def test_interval_follows_young_daly_and_records_inputs():
    choice = young_daly_interval(save_seconds=2.0, mtbf_seconds=3600.0, step_seconds=0.5)
    expected = (math.sqrt(2 * 2.0 * 3600.0) - 2.0) / 0.5
    assert choice == round(expected) and isinstance(choice, int)
    record = choice.record()
    assert record["checkpoint_every_steps"] == choice.steps
    assert record["checkpoint_save_seconds"] == 2.0 and record["checkpoint_mtbf_seconds"] == 3600.0


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
