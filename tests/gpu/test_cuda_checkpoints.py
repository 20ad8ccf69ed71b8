"""Checkpoints of CUDA tensors: the background save's copy waits for the kernels queued before it, and for nothing
else (a side stream). Skipped without a GPU; benchmarks/device_checks.sh runs them on one (with --noconftest:
the suite's conftest needs services a GPU machine lacks, and these tests use none of them)."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import AsyncCheckpointer, open_store

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def store(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def queue_additions(tensor: torch.Tensor, count: int) -> None:
    """COUNT kernels on the current stream, each adding 1 to every element: long enough to be in flight when
    the save starts."""
    for _ in range(count):
        tensor.add_(1.0)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_copy_reads_what_the_kernels_queued_before_the_save_wrote(store, overlap: bool) -> None:
    weights = torch.zeros(64 << 20 >> 2, device="cuda")  # 64 MiB
    moments = torch.arange(1000, dtype=torch.bfloat16, device="cuda")
    queue_additions(weights, 200)
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, {"w": weights, "m": moments}, overlap=overlap)
        checkpointer.ready()  # the loop's optimizer step may change the state after this
        queue_additions(weights, 5)
        result = checkpointer.wait()
        assert result.ok, result.error
        assert list(checkpointer._streams) == [weights.device]  # copied on the device's side stream
    restored = store.restore_latest("r").state
    assert torch.equal(restored["w"], torch.full_like(weights, 200.0).cpu())
    assert torch.equal(restored["m"], moments.cpu()) and restored["m"].dtype == torch.bfloat16


def test_a_copy_on_a_side_stream_waits_for_the_callers_stream_not_the_default_one(store) -> None:
    weights = torch.zeros(1 << 20, device="cuda")
    training = torch.cuda.Stream()
    with torch.cuda.stream(training):  # a loop that trains on a stream of its own
        queue_additions(weights, 100)
        with AsyncCheckpointer(store) as checkpointer:
            checkpointer.save_async("r", 1, {"w": weights}, overlap=True)
            checkpointer.ready()
            assert checkpointer.wait().ok
    assert torch.equal(store.restore_latest("r").state["w"], torch.full((1 << 20,), 100.0))
