"""The GPT template and the text snapshot's tokenizer, without a process group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training_platform.datasets import build_snapshot
from training_platform.datasets.text import CharTokenizer, load_tokenizer, token_windows
from training_platform.errors import SnapshotError
from training_platform.spec import parse_spec
from training_platform.train.templates import get_template

gpt = get_template("gpt")


def _spec(**model):
    return parse_spec({"name": "g", "team": "qa", "owner": "ci", "model": {"template": "gpt", "size": "tiny", **model}})


def test_tokenizer_learns_frequent_characters_and_round_trips():
    tokenizer = CharTokenizer.learn("ab" * 30 + "z", min_count=20)
    assert tokenizer.chars == "\x00ab" and tokenizer.vocab_size == 3
    ids = tokenizer.encode("abzba")
    assert ids.tolist() == [1, 2, 0, 2, 1]  # 'z' is rare: <unk>
    assert tokenizer.decode(ids) == "ab\x00ba"
    assert CharTokenizer.from_json(tokenizer.to_json()) == tokenizer


def test_windows_and_their_next_token():
    tokenizer = CharTokenizer("\x00abc")
    windows, following = token_windows("abcabcab", tokenizer, window=3)
    assert windows.tolist() == [[1, 2, 3], [1, 2, 3]]
    assert following.tolist() == [1, 0]


def test_text_snapshot_carries_its_tokenizer(tmp_path):
    manifest = build_snapshot("python_stdlib_text", tmp_path)
    tokenizer = load_tokenizer(tmp_path, manifest)
    assert manifest.source == "python_stdlib_text" and tokenizer.vocab_size == manifest.num_classes
    assert manifest.num_features == 129 and manifest.rows["train"] > 4000
    assert tokenizer.decode(tokenizer.encode("def main():")) == "def main():"
    (tmp_path / "tokenizers" / f"{manifest.source_sha256}.json").unlink()
    with pytest.raises(SnapshotError, match="no tokenizer"):
        load_tokenizer(tmp_path, manifest)


def test_model_is_causal_and_shapes_match():
    torch.manual_seed(0)
    spec = _spec(seq_len=16)
    model = gpt.build_model(spec, num_features=129, num_classes=50).eval()
    rows = torch.from_numpy(np.random.default_rng(0).integers(0, 50, size=(2, 129)))
    inputs, targets = gpt.split_batch(rows, spec)
    assert inputs.shape == targets.shape == (2, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    logits = model(inputs)
    assert logits.shape == (2, 16, 50)
    changed = inputs.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    with torch.no_grad():
        assert torch.allclose(model(changed)[:, :10], logits[:, :10])  # the future cannot leak backwards
        assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])
    assert gpt.loss_fn(logits, targets).item() == pytest.approx(np.log(50), rel=0.1)


def test_sizes_and_errors():
    assert gpt.dimensions(_spec()) == (2, 2, 64)
    assert gpt.dimensions(_spec(size="small", layers=3)) == (3, 4, 128)
    with pytest.raises(ValueError, match="seq_len <= 128"):
        gpt.build_model(_spec(seq_len=256), num_features=129, num_classes=50)
    with pytest.raises(Exception, match="multiple of model.heads"):
        _spec(width=100, heads=3)


def test_evaluate_split_reports_next_token_accuracy(tmp_path):
    manifest = build_snapshot("python_stdlib_text", tmp_path)
    spec = _spec(seq_len=16)
    torch.manual_seed(0)
    model = gpt.build_model(spec, manifest.num_features, manifest.num_classes)
    metrics = gpt.evaluate_split(model, tmp_path, manifest, "test", spec)
    assert metrics["loss"] == pytest.approx(np.log(manifest.num_classes), rel=0.05)  # untrained: near uniform
    assert 0 <= metrics["accuracy"] < 0.2
