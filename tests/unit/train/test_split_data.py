"""session.dataset(split): a script's batches by step, sharded across ranks, the same after a resume."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from training_platform.datasets import build_snapshot
from training_platform.datasets.files import FileSource, build_file_snapshot
from training_platform.datasets.text import load_tokenizer
from training_platform.spec.file_source import FileColumns
from training_platform.train.split_data import SplitBatches, SplitStream

WINE = Path(__file__).resolve().parents[3] / "examples" / "own_data" / "data"


def _load(root: Path, snapshot_id: str, rank: int, world_size: int = 2) -> SplitBatches:
    return SplitBatches.load(root, snapshot_id, "train", batch_size=8, rank=rank, world_size=world_size, seed=3)


def test_each_rank_reads_its_own_rows_and_a_reload_reads_the_same(tmp_path):
    manifest = build_file_snapshot(FileSource(uri=str(WINE), columns=FileColumns(label="cultivar")), tmp_path).manifest
    ranks = [_load(tmp_path, manifest.snapshot_id, rank) for rank in (0, 1)]
    data = ranks[0]
    assert (len(data), data.num_features, data.num_classes) == (manifest.rows["train"], 13, 3)
    assert data.label_names == ["barbera", "barolo", "grignolino"]
    assert data.features.dtype == torch.float32 and data.features.min() >= 0 and data.features.max() <= 1

    def rows(batches: SplitBatches, step: int) -> set[tuple[float, ...]]:
        return {tuple(row.tolist()) for row in batches[step][0]}

    for step in (0, 1, 6, 40):
        assert not rows(ranks[0], step) & rows(ranks[1], step)  # the ranks split each step's batch
    # A resumed script (a new process) reads at step 40 what the first one read there.
    again = _load(tmp_path, manifest.snapshot_id, 0)
    for (x, y), (x2, y2) in zip((data[40], data[41]), (again[40], again[41]), strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert [batch[0].shape[0] for batch, _ in zip(again.from_step(40), range(3), strict=False)] == [8, 8, 8]
    # Each epoch reshuffles: the first batch of epoch 1 is not that of epoch 0.
    per_epoch = data.sampler.steps_per_epoch
    assert data.epoch(per_epoch) == 1 and rows(data, 0) != rows(data, per_epoch)



def test_a_text_snapshot_gives_its_token_ids_and_the_tokenizer_that_made_them(tmp_path):
    # Imported here, as transformers (2.7 s) is, by the worker that runs the test, not by every worker's collection.
    from training_platform.train.adapters.hf import snapshot_tokenizer

    manifest = build_snapshot("python_stdlib_text", tmp_path)
    test = SplitBatches.load(tmp_path, manifest.snapshot_id, "test", batch_size=8, rank=0, world_size=1, seed=3)
    # Ids as stored, not scaled to [0, 1]: a model embeds them.
    assert test.features.dtype == torch.int64 and test.features.shape[1] == manifest.num_features
    assert 1 < int(test.features.max()) < manifest.num_classes

    snapshot = SimpleNamespace(snapshot_id=manifest.snapshot_id)
    session = SimpleNamespace(hooks=SimpleNamespace(snapshot_root=tmp_path), spec=SimpleNamespace(dataset=snapshot))
    tokenizer = snapshot_tokenizer(session)
    chars = load_tokenizer(tmp_path, manifest)
    row = test.features[0]
    # The transformers tokenizer gives exactly the snapshot's ids: newlines and unknown characters too.
    assert tokenizer(chars.decode(row))["input_ids"] == row.tolist()
    assert tokenizer("x\n\n\u20ac")["input_ids"] == chars.encode("x\n\n\u20ac").tolist()
    assert tokenizer.decode(tokenizer("def f():\n")["input_ids"]) == "def f():\n"


def test_the_hf_adapter_names_the_pipeline_a_model_serves():
    from transformers import BertConfig, BertForSequenceClassification, BertModel, GPT2Config, GPT2LMHeadModel

    from training_platform.train.adapters.hf import pipeline_task

    tiny = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8}
    assert pipeline_task(GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=2))) == "text-generation"
    assert pipeline_task(BertForSequenceClassification(BertConfig(**tiny))) == "text-classification"
    with pytest.raises(TypeError, match="BertModel serves none of the text pipelines"):
        pipeline_task(BertModel(BertConfig(**tiny)))


def test_a_streamed_split_gives_each_rank_its_own_rows_the_same_after_a_resume(tmp_path):
    manifest = build_snapshot("python_stdlib_text", tmp_path)
    first = [f"tok_{i}" for i in range(17)]

    def stream(rank: int, **options) -> SplitStream:
        sampling = {"batch_size": 8, "rank": rank, "world_size": 2, "seed": 3, **options}
        return SplitStream.load(tmp_path, manifest.snapshot_id, "train", columns=first, **sampling)

    ranks = [stream(rank) for rank in (0, 1)]
    tokens, labels = ranks[0][5]
    assert tokens.dtype == torch.int64 and tokens.shape == (8, 17) and labels.shape == (8,)
    assert ranks[0].num_features == 17 and ranks[0].num_classes == manifest.num_classes
    # The ranks read different rows; decoded ahead by a worker process or read in place, the batches are the same.
    assert not {tuple(r.tolist()) for r in tokens} & {tuple(r.tolist()) for r in ranks[1][5][0]}
    ahead = list(stream(0, workers=1).from_step(5, 9))
    in_place = [ranks[0][step] for step in range(5, 9)]
    assert len(ahead) == 4 and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ahead, in_place, strict=True)
    )
    # The stream is the in-memory split's rows: the same tokens, only the first columns.
    whole = SplitBatches.load(tmp_path, manifest.snapshot_id, "train", batch_size=8, rank=0, world_size=1, seed=3)
    assert {tuple(r.tolist()) for r in tokens} <= {tuple(r[:17].tolist()) for r in whole.features}
    with pytest.raises(ValueError, match="has no feature column.s. nope; its features are tok_0, tok_1"):
        SplitStream.load(tmp_path, manifest.snapshot_id, "train", columns=["nope"], batch_size=8, rank=0,
                         world_size=1, seed=3)


def test_a_streamed_table_split_is_scaled_as_the_in_memory_one(tmp_path):
    manifest = build_file_snapshot(FileSource(uri=str(WINE), columns=FileColumns(label="cultivar")), tmp_path).manifest
    streamed = SplitStream.load(tmp_path, manifest.snapshot_id, "train", batch_size=8, rank=0, world_size=1, seed=3)
    whole = _load(tmp_path, manifest.snapshot_id, 0, world_size=1)
    features, labels = streamed[0]
    assert features.dtype == torch.float32 and features.shape == (8, 13)
    rows = {tuple(round(v, 5) for v in row.tolist()) for row in whole.features}
    assert all(tuple(round(v, 5) for v in row.tolist()) in rows for row in features)
    assert set(labels.tolist()) <= set(range(3))


def test_a_model_of_text_needs_its_own_example_and_evaluation_to_be_registered():
    from torch import nn

    from training_platform.train.evaluation_mode import _classifier_metrics, log_pytorch_model
    from training_platform.train.split_data import Sampling, SplitBatches

    test = SplitBatches(torch.empty(4, 0), torch.tensor([0, 1, 0, 1]), Sampling(2, 0, 1, 0), ["neg", "pos"], "test",
                        {"text": ["good", "bad", "fine", "dull"]})
    assert test[0].text is not None and len(test[0].text) == 2
    import pickle

    assert pickle.loads(pickle.dumps(test[0])).text == test[0].text  # a batch pickles with its text
    with pytest.raises(ValueError, match=r"no numeric features to trace the model on for the registry: give one input "
                                         r"as the model takes it, session.evaluate_with\(evaluate, example="):
        log_pytorch_model(nn.Linear(3, 2), test)
    with pytest.raises(ValueError, match=r"no numeric features for the default evaluation .* session.evaluate_with"):
        _classifier_metrics(nn.Linear(3, 2), test)
