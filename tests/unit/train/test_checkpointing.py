"""RunCheckpointer reports every background save, however many the saver has forgotten."""

from __future__ import annotations

import torch

from training_platform.checkpoints import RetentionPolicy, async_saver, open_store
from training_platform.spec import CheckpointSpec
from training_platform.train.checkpointing import RunCheckpointer, retention_policy


def test_every_save_is_reported_after_the_saver_trims_its_results(tmp_path, monkeypatch):
    monkeypatch.setattr(async_saver, "KEPT_RESULTS", 2)
    saved: list[int] = []
    checkpointer = RunCheckpointer(
        open_store(tmp_path / "store"),
        "r",
        retention=RetentionPolicy(keep_last=2),
        background=True,
        on_saved=lambda manifest: saved.append(manifest.step),
        on_failed=lambda step, error: saved.append(-step),
    )
    try:
        for step in range(1, 6):
            checkpointer.save(step, {"w": torch.full((64,), float(step))}, None, wait=False)
            checkpointer.flush()  # one new result per collection; the saver keeps two
    finally:
        checkpointer.close()
    assert saved == [1, 2, 3, 4, 5]


def test_the_specs_retention_fields_become_the_stores_policy():
    spec = CheckpointSpec(
        keep_last=2, keep_best={"metric": "val_accuracy", "mode": "max", "count": 3}, keep_every_steps=500
    )
    assert retention_policy(spec) == RetentionPolicy(
        keep_last=2, keep_best=3, best_metric="val_accuracy", best_mode="max", keep_every=500
    )
    assert retention_policy(CheckpointSpec()) == RetentionPolicy(keep_last=3)
