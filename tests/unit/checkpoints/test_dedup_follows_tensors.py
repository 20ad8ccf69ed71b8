"""Chunks follow tensors, with the store's real sizes: an unchanged tensor is never rewritten because its
neighbour in the state changed (a fine-tune's frozen layers cost nothing after the first save)."""

from __future__ import annotations

import torch

from training_platform.checkpoints import open_store, writer


def fine_tune_state(layers: int, numel: int) -> dict[str, torch.Tensor]:
    """Frozen and trainable layers interleaved in state order, each with a small bias."""
    torch.manual_seed(0)
    state = {}
    for i in range(layers):
        state[f"layer{i}.weight"] = torch.randn(numel)
        state[f"layer{i}.bias"] = torch.randn(16)
    return state


def test_a_changed_layer_rewrites_itself_and_the_small_tensors_pack_not_its_frozen_neighbours(tmp_path):
    numel = 128 << 10  # 0.5 MB layers of float32: packed together before chunks followed tensors
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    state = fine_tune_state(layers=8, numel=numel)
    store.save("fine-tune", 1, {"model": state})
    trainable = [f"layer{i}.weight" for i in range(1, 8, 2)]
    for name in trainable:
        state[name] += 1.0
    manifest, stats = store.save("fine-tune", 2, {"model": state})
    changed = len(trainable) * numel * 4
    small = 8 * 16 * 4 + manifest.skeleton.size  # the biases' pack and the skeleton are all that may come along
    assert changed <= stats.bytes_written <= changed + small, (stats.bytes_written, changed)
    restored = store.restore_latest("fine-tune")
    assert all(torch.equal(restored.state["model"][k], v) for k, v in state.items())


def test_small_tensors_share_packs_of_bounded_size(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    count = 3 * writer.PACK_BYTES // writer.PACK_BELOW_BYTES * 2  # three packs' worth of half-threshold tensors
    state = {f"t{i}": torch.full((writer.PACK_BELOW_BYTES // 8,), float(i)) for i in range(count)}
    manifest, _ = store.save("many-small", 1, state)
    packs = {chunk.digest for tensor in manifest.tensors for chunk in tensor.chunks}
    assert len(packs) == 3
    assert all(chunk.size <= writer.PACK_BYTES for tensor in manifest.tensors for chunk in tensor.chunks)
