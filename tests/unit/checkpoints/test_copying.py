"""Bytes copied for a save without the GIL arrive exactly, from any buffer a save hands over."""

from __future__ import annotations

import mmap

import pytest
import torch

from training_platform.checkpoints.copying import copy_bytes


@pytest.mark.parametrize("size", [0, 1, 4097, (8 << 20) + 5])
def test_copies_every_byte_into_a_writable_map(size: int) -> None:
    source = torch.randint(0, 256, (size,), dtype=torch.uint8).numpy().tobytes()  # bytes: read-only
    destination = mmap.mmap(-1, size + 16)
    copy_bytes(memoryview(destination)[8 : 8 + size], source)
    assert destination[8 : 8 + size] == source
    assert destination[:8] == bytes(8) and destination[8 + size :] == bytes(8)  # nothing outside the slice


def test_copies_from_a_tensors_memory_of_another_format() -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    source = memoryview(tensor.numpy()).cast("B")
    destination = bytearray(len(source))
    copy_bytes(memoryview(destination), source)
    assert torch.equal(torch.frombuffer(destination, dtype=torch.float32), tensor)


def test_lengths_that_differ_are_refused() -> None:
    with pytest.raises(ValueError):
        copy_bytes(memoryview(bytearray(4)), b"12345")
