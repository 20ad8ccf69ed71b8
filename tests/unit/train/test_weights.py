import torch

from training_platform.train.weights import weights_sha256


def test_fingerprint_changes_with_any_bit_and_ignores_key_order():
    state = {"b": torch.ones(3), "a": torch.zeros(2, 2)}
    same = {"a": torch.zeros(2, 2), "b": torch.ones(3)}
    assert weights_sha256(state) == weights_sha256(same)
    flipped = {"a": torch.zeros(2, 2), "b": torch.tensor([1.0, 1.0, 1.0 + 2**-23])}
    assert weights_sha256(flipped) != weights_sha256(state)
    assert weights_sha256({"a": torch.zeros(4)}) != weights_sha256({"a": torch.zeros(2, 2)})
