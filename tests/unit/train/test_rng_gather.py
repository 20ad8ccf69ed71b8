"""Every rank's RNG states reach every rank in one collective, and restore each rank's streams."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tests.fixtures.ranks import spawn_ranks
from training_platform.train import distributed
from training_platform.train.distributed import DistInfo


def _draws() -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(1))]


def _rank(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    info = DistInfo(rank, 2, rank, 2, torch.device("cpu"), "gloo")
    distributed.seed_everything(100 + rank)
    _draws()  # the streams have moved on from their seeds
    states = distributed.all_gather_rng_states(info)
    expected = _draws()
    restored = []
    for state in states:  # each rank's streams, replayed here
        distributed.set_rng_state(state)
        restored.append(_draws())
    with open(f"{out}.{rank}", "w") as handle:
        json.dump({"expected": expected, "restored": restored}, handle)
    dist.destroy_process_group()


def test_each_ranks_states_are_gathered_in_rank_order(tmp_path):
    out = str(tmp_path / "out")
    spawn_ranks(_rank, (str(tmp_path / "init"), out))
    results = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]
    for seen_by in results:
        assert seen_by["restored"] == [results[0]["expected"], results[1]["expected"]]
    assert results[0]["expected"] != results[1]["expected"]  # the ranks' streams differ


def test_a_single_process_gathers_its_own_states():
    (state,) = distributed.all_gather_rng_states(DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo"))
    expected = _draws()
    distributed.set_rng_state(state)
    assert _draws() == expected
