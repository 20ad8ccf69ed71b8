"""session.dataset(split): a script's batches by step, sharded across ranks, the same after a resume."""

from __future__ import annotations

from pathlib import Path

import torch

from training_platform.datasets.file_spec import FileColumns
from training_platform.datasets.files import FileSource, build_file_snapshot
from training_platform.train.split_data import SplitBatches

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
