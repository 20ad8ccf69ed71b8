"""Tiering to a cold storage: older checkpoints move, restore reads wherever they live."""

from __future__ import annotations

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
