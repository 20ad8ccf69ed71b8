"""The S3 tier against a real S3 server (seaweedfs on loopback)."""

from __future__ import annotations

import logging

import pytest
import torch

from training_platform.checkpoints import AsyncCheckpointer, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.s3 import S3Storage
from training_platform.checkpoints.tiering import TieringPolicy, apply_tiering
from training_platform.errors import CheckpointError

pytestmark = pytest.mark.integration


def state(step: int) -> dict:
    return {
        "big": torch.full((5_000_000,), float(step)),  # 20 MB: one multipart chunk
        "frozen": torch.arange(2_000_000, dtype=torch.float32),
        "small": torch.tensor([step]),
    }


def test_save_restore_dedup_on_s3(s3_server, s3_bucket, caplog):
    caplog.set_level(logging.DEBUG)
    store = open_store(f"s3://{s3_bucket}/team/ckpts")
    store.lease_settle_seconds = 0.5
    first, stats1 = store.save("run-1", 1, state(1), {"loss": 2.0})
    second, stats2 = store.save("run-1", 2, state(2), {"loss": 1.0})
    assert stats1.bytes_written == first.total_bytes
    assert stats2.bytes_deduplicated >= 8_000_000  # `frozen` is not uploaded again
    assert second.uri == f"s3://{s3_bucket}/team/ckpts/{manifest_key('run-1', 2)}"
    restored = store.restore_latest("run-1")
    assert restored.manifest.step == 2 and torch.equal(restored.state["big"], state(2)["big"])
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert f"team/ckpts/{manifest_key('run-1', 1)}" in keys and not any(k.startswith("team/ckpts/leases") for k in keys)
    secret = s3_server.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in caplog.text and secret not in second.model_dump_json()


def test_corrupted_object_on_s3_is_named_and_restore_falls_back(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/x")
    store.lease_settle_seconds = 0.5
    store.save("r", 1, state(1))
    newest, _ = store.save("r", 2, state(2))
    big = newest.tensors[0].chunks[0].digest
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"x/{chunk_key(big)}", Body=b"garbage")
    restored = store.restore_latest("r")
    assert restored.manifest.step == 1 and big in restored.skipped[0][1]


def test_damaged_chunks_on_s3_are_written_again_or_quarantined(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/repair")
    store.lease_settle_seconds = 0.5
    first, _ = store.save("r", 1, state(1))
    big, frozen = (first.tensors[i].chunks[0] for i in (0, 1))
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key=f"repair/{chunk_key(frozen.digest)}", Body=b"")  # truncated
    client.put_object(Bucket=s3_bucket, Key=f"repair/{chunk_key(big.digest)}", Body=bytes(big.size))  # zeroed

    _, stats = store.save("r", 2, state(1))
    assert stats.bytes_written >= frozen.size and stats.bytes_deduplicated >= big.size  # same size: trusted
    with pytest.raises(CheckpointError, match=f"{big.digest} does not match its blake3 hash.*quarantined"):
        store.load(store.list("r")[-1])
    assert len(store.storage.list("quarantine")) == 1 and not store.storage.exists(chunk_key(big.digest))
    _, stats = store.save("r", 3, state(1))
    assert stats.bytes_written >= big.size
    assert torch.equal(store.restore_latest("r").state["big"], state(1)["big"])


def test_async_saves_to_s3_from_a_separate_process(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/async")
    with AsyncCheckpointer(store) as checkpointer:
        checkpointer.save_async("r", 1, state(1))
        result = checkpointer.wait()
    assert result.ok, result.error
    assert torch.equal(store.restore_latest("r").state["frozen"], state(1)["frozen"])


def test_tiering_to_a_colder_storage_class(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/hot", cold_uri=f"s3://{s3_bucket}/cold?storage_class=STANDARD_IA")
    store.lease_settle_seconds = 0.5
    for step in (1, 2, 3):
        store.save("r", step, state(step))
    report = apply_tiering(store, "r", TieringPolicy(keep_hot_last=1))
    assert report.moved_steps == [1, 2]
    assert [m.tier for m in store.list("r")] == ["cold", "cold", "hot"]
    assert store.cold.storage_class_of(manifest_key("r", 1)) == "STANDARD_IA"
    store.gc(grace_seconds=0)
    assert torch.equal(store.load(store.list("r")[0])["big"], state(1)["big"])


def test_unreachable_endpoint_fails_with_a_clear_message(monkeypatch):
    storage = S3Storage("bucket", "p", endpoint_url="http://127.0.0.1:9", max_attempts=2)
    with pytest.raises(CheckpointError, match=r"S3 upload of s3://bucket/p/chunks/x.*reachable"):
        storage.put("chunks/x", b"data")


def test_bad_s3_uris_and_keys_are_refused():
    with pytest.raises(CheckpointError, match="not an S3 URI"):
        S3Storage.from_uri("s3:///nobucket")
    with pytest.raises(ValueError, match="invalid storage key"):
        S3Storage("b", "../escape")


def test_lifecycle_tiers_old_checkpoints_to_a_colder_class_and_collects_both_tiers(s3_server, s3_bucket, tmp_path):
    from datetime import datetime, timedelta

    from training_platform.lifecycle.collect import run_lifecycle
    from training_platform.lifecycle.settings import LifecycleSettings
    from training_platform.paths import PlatformHome

    hot_uri, cold_uri = f"s3://{s3_bucket}/hot", f"s3://{s3_bucket}/cold?storage_class=STANDARD_IA"
    store = open_store(hot_uri)
    store.lease_settle_seconds = 0.5
    small = {step: {"w": torch.full((50_000,), float(step)), "frozen": torch.arange(50_000.0)} for step in range(1, 5)}
    for step, state_ in small.items():
        store.save("r", step, state_)
    settings = LifecycleSettings(tier_after_days=7, keep_hot_last=1, cold_tiers={hot_uri: cold_uri})
    home = PlatformHome(tmp_path / "home")
    later = datetime.fromisoformat(store.list("r")[-1].created_at) + timedelta(days=8)
    report = run_lifecycle(home, settings, f"sqlite:///{tmp_path}/none.db", grace_seconds=0, now=later)

    [s3_store] = [s for s in report.stores if s.uri == hot_uri]
    assert s3_store.error is None and s3_store.tiered == {"r": [1, 2, 3]}
    assert s3_store.gc.by_run["r"].chunks == 3  # the hot copies of three `w` tensors; `frozen` stays for step 4
    reader = open_store(hot_uri)  # finds its cold tier by itself
    assert {m.step: m.tier for m in reader.list("r")} == {1: "cold", 2: "cold", 3: "cold", 4: "hot"}
    cold_chunk = chunk_key(reader.list("r")[0].tensors[0].chunks[0].digest)
    assert reader.cold.storage_class_of(cold_chunk) == "STANDARD_IA"
    for manifest in reader.list("r"):
        assert torch.equal(reader.load(manifest)["w"], small[manifest.step]["w"])
    # Retention spans both tiers; the next GC frees the cold chunks only the removed ones needed:
    # three `w` and the cold copy of `frozen` (step 4 reads the hot one).
    reader.prune("r", keep_last=1)
    again = run_lifecycle(home, settings, f"sqlite:///{tmp_path}/none.db", grace_seconds=0, now=later)
    [s3_store] = [s for s in again.stores if s.uri == hot_uri]
    assert s3_store.gc.by_run["r"].chunks == 4 and [m.step for m in reader.list("r")] == [4]
    assert torch.equal(reader.restore_latest("r").state["frozen"], small[4]["frozen"])
