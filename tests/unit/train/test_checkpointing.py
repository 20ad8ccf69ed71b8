"""RunCheckpointer reports every background save, however many the saver has forgotten."""

from __future__ import annotations

import torch

from training_platform.checkpoints import async_saver, open_store
from training_platform.train.checkpointing import RunCheckpointer


def test_every_save_is_reported_after_the_saver_trims_its_results(tmp_path, monkeypatch):
    monkeypatch.setattr(async_saver, "KEPT_RESULTS", 2)
    saved: list[int] = []
    checkpointer = RunCheckpointer(
        open_store(tmp_path / "store"),
        "r",
        keep_last=2,
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
