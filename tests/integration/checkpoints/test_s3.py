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
