"""Ranks that restore a sharded checkpoint share rank 0's listing, failures included."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tests.fixtures.ranks import spawn_ranks
from training_platform.checkpoints import open_store
from training_platform.checkpoints.layout import manifest_key
from training_platform.checkpoints.manifest import FORMAT_VERSION
from training_platform.checkpoints.sharded import list_on_main


def _rank(rank: int, init_file: str, store_uri: str, out: str) -> None:
    # A short timeout: a rank left waiting for a list that never comes fails the test, not hangs it.
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    try:
        outcome = {"steps": [m.step for m in list_on_main(open_store(store_uri), "run-a").manifests]}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    Path(f"{out}.{rank}").write_text(json.dumps(outcome))
    dist.destroy_process_group()


def _outcomes(tmp_path: Path) -> list[dict]:
    out = str(tmp_path / "out")
    spawn_ranks(_rank, (str(tmp_path / "init"), str(tmp_path / "store"), out))
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


def test_every_rank_gets_rank_0s_list(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    for step in (1, 2):
        store.save("run-a", step, {"w": torch.full((4,), float(step))})
    assert _outcomes(tmp_path) == [{"steps": [1, 2]}, {"steps": [1, 2]}]


def test_a_listing_that_fails_on_rank_0_fails_on_every_rank(tmp_path):
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    store.save("run-a", 1, {"w": torch.zeros(4)})
    path = tmp_path / "store" / manifest_key("run-a", 1)
    body = json.loads(path.read_text()) | {"format_version": FORMAT_VERSION + 1}
    path.write_text(json.dumps(body))
    first, second = _outcomes(tmp_path)
    assert first["error"] == second["error"] == "CheckpointError"
    assert f"checkpoint format {FORMAT_VERSION + 1} is newer than this build reads" in first["message"]
    assert second["message"] == f"rank 0 could not list the checkpoints of run run-a: {first['message']}"
