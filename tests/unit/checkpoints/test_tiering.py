"""Tiering to a cold storage: older checkpoints move, restore reads wherever they live."""

from __future__ import annotations

import pytest
import torch

from training_platform.checkpoints import open_store
from training_platform.checkpoints.tiering import TieringPolicy, apply_tiering


def test_older_checkpoints_move_cold_and_still_restore(tmp_path, small_chunks):
    store = open_store(tmp_path / "hot", cold_uri=str(tmp_path / "cold"))
    store.lease_settle_seconds = 0.0
    frozen = torch.arange(3000, dtype=torch.float32)
    for step in range(1, 5):
        store.save("r", step, {"w": torch.full((100,), float(step)), "frozen": frozen})
    store.pin("r", 1, "serving")
    report = apply_tiering(store, "r", TieringPolicy(keep_hot_last=2))
    assert report.moved_steps == [2] and report.bytes_copied > 0
    tiers = {m.step: m.tier for m in store.list("r")}
    assert tiers == {1: "hot", 2: "cold", 3: "hot", 4: "hot"}
    store.unpin("r", 1, "serving")
    again = apply_tiering(store, "r", TieringPolicy(keep_hot_last=1))
    assert again.moved_steps == [1, 3] and again.bytes_already_cold > 0  # frozen chunks copied once
    store.gc(grace_seconds=0)  # hot chunks of moved checkpoints go
    cold = store.list("r")[0]
    assert cold.tier == "cold" and torch.equal(store.load(cold)["w"], torch.full((100,), 1.0))
    store.prune("r", keep_last=1)  # retention spans both tiers
    assert [m.step for m in store.list("r")] == [4]
    assert torch.equal(store.restore_latest("r").state["frozen"], frozen)


def test_tiering_by_age_keeps_recent_and_pinned_hot_and_readers_find_the_cold_tier(tmp_path, small_chunks):
    from datetime import datetime, timedelta

    from training_platform.checkpoints.store import attach_cold_tier, open_storage

    store = attach_cold_tier(open_storage(tmp_path / "hot"), str(tmp_path / "cold"))
    store.lease_settle_seconds = 0.0
    for step in range(1, 5):
        store.save("r", step, {"w": torch.full((100,), float(step))})
    store.pin("r", 1, "model m v1")
    saved = datetime.fromisoformat(store.list("r")[-1].created_at)
    policy = TieringPolicy(keep_hot_last=1, older_than_days=7)
    assert apply_tiering(store, "r", policy, now=saved + timedelta(days=6)).moved_steps == []  # all recent
    assert apply_tiering(store, "r", policy, now=saved + timedelta(days=8)).moved_steps == [2, 3]
    # A reader that names only the hot store (a job, evaluation) sees the moved checkpoints and restores them.
    reader = open_store(tmp_path / "hot")
    assert {m.step: m.tier for m in reader.list("r")} == {1: "hot", 2: "cold", 3: "cold", 4: "hot"}
    report = reader.gc(grace_seconds=0)
    assert report.by_run["r"].chunks == 2  # the hot copies of steps 2 and 3, attributed to their run
    for manifest in reader.list("r"):
        assert torch.equal(reader.load(manifest)["w"], torch.full((100,), float(manifest.step)))


def test_a_store_keeps_its_cold_tier(tmp_path):
    from training_platform.checkpoints.store import attach_cold_tier, open_storage
    from training_platform.errors import CheckpointError

    hot = open_storage(tmp_path / "hot")
    attach_cold_tier(hot, str(tmp_path / "cold"))
    with pytest.raises(CheckpointError, match="already has the cold tier"):
        attach_cold_tier(hot, str(tmp_path / "colder"))
    with pytest.raises(CheckpointError, match="overlaps"):
        attach_cold_tier(open_storage(tmp_path / "other"), str(tmp_path / "other" / "cold"))
