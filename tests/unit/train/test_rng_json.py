"""RNG states travel through checkpoints as JSON: exact, and nothing to unpickle."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from training_platform.errors import CheckpointError
from training_platform.train.distributed import rng_state, set_rng_state
from training_platform.train.rng_json import rng_states_from_json, rng_states_to_json


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist()


def test_states_round_trip_exactly():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    draws()  # leaves a cached gaussian in python's and numpy's state
    text = rng_states_to_json([rng_state(), rng_state()])
    expected = draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)

    [state, _] = rng_states_from_json(text.encode())
    set_rng_state(state)

    assert draws() == expected


@pytest.mark.parametrize(
    "stored",
    [pickle.dumps([rng_state()]), b'[{"python": [3, [1, "x"], null]}]', b'[{"python": [3, [1], null], "numpy": 1}]'],
    ids=["an-older-pickle", "not-integers", "truncated"],
)
def test_anything_else_is_refused_with_the_reason(stored):
    with pytest.raises(CheckpointError, match="RNG states are not the JSON this build writes"):
        rng_states_from_json(stored)
