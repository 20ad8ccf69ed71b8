"""Ranks agree to stop at one step, checking every few steps (two real gloo processes)."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist

from tests.fixtures.ranks import spawn_ranks
from training_platform.train.distributed import DistInfo
from training_platform.train.stopping import (
    CHECK_SECONDS,
    MAX_STEPS_BETWEEN_CHECKS,
    StopAgreement,
    steps_between_checks,
)

NOTICE_STEP = 40  # rank 1 gets the notice before this step
PROPOSAL_STEP = 15  # from this step on, rank 0 proposes a checkpoint interval (every_steps: auto)
PROPOSED_EVERY = 123.0
STEP_SECONDS = CHECK_SECONDS / 20  # rank 1 takes twice as long: 10 steps fit in CHECK_SECONDS (rank 0 alone: 20)


def _rank(rank: int, init_file: str, out: str, every_step: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    info = DistInfo(rank, 2, rank, 2, torch.device("cpu"), "gloo")
    agreement = None
    intervals = []
    adopted_at = None
    for step in range(1, 2000):
        time.sleep(STEP_SECONDS * (1 + rank))  # rank 1 is the slow one
        # Made at the first poll, after the first step, as TrainingSession.should_stop makes it.
        agreement = agreement or StopAgreement(info, every_step=every_step)
        proposal = PROPOSED_EVERY if rank == 0 and step >= PROPOSAL_STEP else 0.0
        agreed = agreement.poll(stop=rank == 1 and step >= NOTICE_STEP, prune=False, checkpoint_every=proposal)
        if adopted_at is None and agreed.checkpoint_every == PROPOSED_EVERY:
            adopted_at = step
        intervals.append(agreement.interval)
        if step == 1:
            first_interval = agreement.interval
        if agreed.stop:
            break
    with open(f"{out}.{rank}", "w") as handle:
        json.dump(
            {
                "stopped_at": step,
                "prune": agreed.prune,
                "max_interval": max(intervals),
                "first_interval": first_interval,
                "adopted_at": adopted_at,
            },
            handle,
        )
    dist.destroy_process_group()


def _run(tmp_path, every_step: bool) -> list[dict]:
    out = str(tmp_path / "out")
    spawn_ranks(_rank, (str(tmp_path / "init"), out, every_step))
    return [json.loads(open(f"{out}.{rank}").read()) for rank in (0, 1)]


def test_ranks_stop_together_soon_after_one_of_them_is_told(tmp_path):
    rank0, rank1 = _run(tmp_path, every_step=False)
    assert rank0["stopped_at"] == rank1["stopped_at"] >= NOTICE_STEP
    # Checked every few steps, not every step, sized alike on both ranks from the slow one.
    assert 5 <= rank0["max_interval"] == rank1["max_interval"] <= 10
    assert rank0["stopped_at"] - NOTICE_STEP <= rank0["max_interval"]
    assert rank0["first_interval"] == 1  # no step was timed yet: not taken for an instant one
    assert not rank0["prune"]
    # Rank 0's proposed checkpoint interval reaches both ranks at one step, at the next check.
    assert rank0["adopted_at"] == rank1["adopted_at"]
    assert PROPOSAL_STEP <= rank0["adopted_at"] < PROPOSAL_STEP + rank0["max_interval"]


def test_trials_agree_on_every_step(tmp_path):
    rank0, rank1 = _run(tmp_path, every_step=True)
    assert rank0["stopped_at"] == rank1["stopped_at"] == NOTICE_STEP
    assert rank0["max_interval"] == 1


@pytest.mark.parametrize(
    ("step_seconds", "steps"),
    [(CHECK_SECONDS / 10, 10), (CHECK_SECONDS / 1000, MAX_STEPS_BETWEEN_CHECKS), (CHECK_SECONDS * 3, 1), (0.0, 1)],
)
def test_steps_between_checks(step_seconds, steps):
    assert steps_between_checks(step_seconds) == steps


def test_one_process_stops_at_once_and_carries_its_own_proposal():
    agreement = StopAgreement(DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo"))
    first = agreement.poll(stop=False, prune=False, checkpoint_every=7.0)
    assert first == (False, False, 7.0)  # the first poll checks
    agreement.interval = 10  # between checks, a notice still counts at the step it arrives
    assert agreement.poll(stop=True, prune=False) == (True, False, None)
