"""The step sampler: ranks read disjoint rows, epochs reshuffle, and any step can be re-read."""

import pytest
import torch

from training_platform.train.sampler import StepSampler


def test_ranks_read_disjoint_rows_within_a_step():
    samplers = [StepSampler(100, 8, rank, 3, seed=5) for rank in range(3)]
    rows = [set(s.indices(4).tolist()) for s in samplers]
    assert all(len(r) == 8 for r in rows)
    assert not (rows[0] & rows[1] or rows[1] & rows[2] or rows[0] & rows[2])


def test_an_epoch_visits_each_row_at_most_once():
    sampler = StepSampler(100, 10, 0, 1, seed=0)
    seen = torch.cat([sampler.indices(step) for step in range(sampler.steps_per_epoch)])
    assert len(set(seen.tolist())) == len(seen) == 100


def test_epochs_reshuffle_and_positions_are_addressable():
    sampler = StepSampler(64, 8, 0, 1, seed=3)
    assert sampler.position(9) == (1, 1)
    assert not torch.equal(sampler.indices(0), sampler.indices(8))
    fresh = StepSampler(64, 8, 0, 1, seed=3)
    # A sampler created at resume time reads exactly what the original read at that step.
    assert torch.equal(fresh.indices(13), sampler.indices(13))


def test_too_little_data_is_a_clear_error():
    with pytest.raises(ValueError, match="lower training.batch_size"):
        StepSampler(10, 8, 0, 2, seed=0)
