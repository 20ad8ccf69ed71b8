"""Restoring into the caller's tensors: what fits is read into in place, the rest into new memory, exactly."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import pack_key

from .test_store import assert_same, make_state


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def blank_like(state):
    """A state of the same paths, dtypes and shapes holding other values: a resume's freshly built model."""
    if isinstance(state, torch.Tensor):
        return torch.full_like(state, 7) if state.dtype != torch.bool else torch.zeros_like(state)
    if isinstance(state, dict):
        return {key: blank_like(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(blank_like(value) for value in state)
    return state


def test_tensors_that_fit_are_restored_in_place_large_and_small(store):
    saved = make_state(1)
    store.save("run-a", 1, saved)
    into = blank_like(saved)
    restored = store.restore_latest("run-a", into=into)
    assert_same(saved, restored.state)
    for name in ("big", "small", "half", "ints", "mask"):  # big owns its chunks; the rest share a packed one
        assert restored.state["model"][name] is not into["model"][name]
        assert restored.state["model"][name].data_ptr() == into["model"][name].data_ptr(), name
        assert torch.equal(into["model"][name], saved["model"][name]), name


def test_a_tensor_that_does_not_fit_is_left_alone_and_restored_in_new_memory(store):
    saved = make_state(1)
    store.save("run-a", 1, saved)
    into = blank_like(saved)
    into["model"]["big"] = torch.zeros(2999)  # another shape
    into["model"]["small"] = torch.zeros(7, dtype=torch.float64)  # another dtype
    into["model"]["transposed"] = torch.zeros(6, 4).t()  # not contiguous (saved contiguous, same shape)
    before = {name: into["model"][name].clone() for name in ("big", "small", "transposed")}
    restored = store.restore_latest("run-a", into=into)
    assert_same(saved, restored.state)
    for name, value in before.items():
        assert torch.equal(into["model"][name], value), name
        assert restored.state["model"][name].data_ptr() != into["model"][name].data_ptr(), name


def test_one_memory_at_two_paths_takes_one_tensor_and_both_are_exact(store):
    """Tied weights: two reads into one memory would race each other's hash check."""
    saved = {"encoder": torch.randn(3000), "decoder": torch.randn(3000)}
    store.save("run-a", 1, saved)
    tied = torch.zeros(3000)
    restored = store.restore_latest("run-a", into={"encoder": tied, "decoder": tied})
    assert_same(saved, restored.state)
    pointers = {restored.state[name].data_ptr() for name in saved}
    assert tied.data_ptr() in pointers and len(pointers) == 2


def test_a_damaged_newest_checkpoint_leaves_the_older_ones_values_in_place(store, tmp_path):
    older = make_state(1)
    store.save("run-a", 1, older)
    newest, _ = store.save("run-a", 2, make_state(2))
    big = next(t for t in newest.tensors if t.shape == [3000])
    pack = tmp_path / "store" / pack_key(big.chunks[-1].pack)
    data = bytearray(pack.read_bytes())
    data[big.chunks[-1].offset + 10] ^= 0xFF  # the last chunk: the earlier ones were read into place already
    pack.write_bytes(bytes(data))
    into = blank_like(older)
    restored = store.restore_latest("run-a", into=into)
    assert restored.manifest.step == 1 and [step for step, _ in restored.skipped] == [2]
    assert_same(older, restored.state)
    assert torch.equal(into["model"]["big"], older["model"]["big"])
