"""Manifests are signed with the deployment's key: one that anyone could have written to the store
(unsigned, signed with another key, edited after signing, copied from another run) is not restored."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")


def state(value: float) -> dict:
    return {"w": torch.full((16,), value)}


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def forge(store: CheckpointStore, step: int, body: dict) -> None:
    """Write a manifest as someone who can write the store: its sha256 matches, as anyone can make it."""
    body = body | {"step": step}
    content = {k: v for k, v in body.items() if k not in ("manifest_sha256", "signature", "uri", "tier")}
    body["manifest_sha256"] = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())
    body["manifest_sha256"] = body["manifest_sha256"].hexdigest()
    store.storage.put(manifest_key(body["run_id"], step), json.dumps(body).encode())


def test_a_forged_unsigned_manifest_is_not_restored(store):
    store.save("r", 1, state(1.0))
    # The attacker's weights, in a chunk and a manifest of a higher step that restore would prefer.
    evil, _ = store.save("scratch", 1, state(666.0))
    body = json.loads(store.storage.get(manifest_key("scratch", 1)))
    body.pop("signature", None)
    forge(store, 2, body | {"run_id": "r"})

    restored = store.restore_latest("r")

    assert restored.manifest.step == 1 and torch.equal(restored.state["w"], state(1.0)["w"])
    [(step, reason)] = restored.skipped
    assert step == 2 and "is not signed" in reason and "TP_CHECKPOINT_SIGNING_KEY" in reason


def test_a_signed_manifest_edited_afterwards_is_not_restored(store):
    store.save("r", 1, state(1.0))
    store.save("r", 2, state(2.0), {"loss": 1.0})
    body = json.loads(store.storage.get(manifest_key("r", 2)))
    body["metrics"]["loss"] = 0.01  # a "better" checkpoint; the signature is kept, the sha256 redone
    forge(store, 2, body)

    restored = store.restore_latest("r")

    assert restored.manifest.step == 1
    assert "does not match its signature" in restored.skipped[0][1]


def test_a_manifest_signed_with_another_key_is_not_restored(store, tmp_path, monkeypatch):
    store.save("r", 1, state(1.0))
    monkeypatch.setenv("TP_CHECKPOINT_SIGNING_KEY", os.urandom(32).hex())
    other = open_store(tmp_path / "store")  # another deployment writing to the same store
    other.lease_settle_seconds = 0.0
    other.save("r", 2, state(2.0))
    monkeypatch.undo()

    restored = store.restore_latest("r")

    assert restored.manifest.step == 1
    reason = restored.skipped[0][1]
    assert "signed with another key" in reason and store.signer.key_id in reason


def test_a_signed_manifest_copied_to_another_run_is_not_restored(store):
    store.save("a", 5, state(5.0))
    store.storage.put(manifest_key("b", 5), store.storage.get(manifest_key("a", 5)))
    with pytest.raises(CheckpointError, match="says it is step 5 of run a: a manifest copied or moved"):
        store.restore_latest("b")


def test_every_way_of_saving_signs(store, tmp_path):
    from training_platform.checkpoints import AsyncCheckpointer

    store.save("r", 1, state(1.0))
    (tmp_path / "f.bin").write_bytes(b"files")
    store.save_files("r", 2, {"f.bin": tmp_path / "f.bin"})
    with AsyncCheckpointer(store) as saver:  # the background writer process
        saver.save_async("r", 3, state(3.0))
        assert saver.wait().ok
    for manifest in store.list("r"):
        assert manifest.signature.startswith(f"hmac-sha256:{store.signer.key_id}:")
        store.check_manifest(manifest)


def test_the_local_default_key_is_made_once_under_the_platform_home_for_its_owner_only(tmp_path, monkeypatch):
    monkeypatch.delenv("TP_CHECKPOINT_SIGNING_KEY")
    monkeypatch.setenv("TP_HOME", str(tmp_path / "home"))
    first = open_store(tmp_path / "store")
    first.lease_settle_seconds = 0.0
    first.save("r", 1, state(1.0))

    key_file = tmp_path / "home" / "checkpoint-signing.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(bytes.fromhex(key_file.read_text().strip())) == 32
    again = open_store(tmp_path / "store")  # a worker of the same deployment
    assert again.signer.key_id == first.signer.key_id
    assert again.restore_latest("r").manifest.step == 1

    key_file.chmod(0o644)
    with pytest.raises(CheckpointError, match=r"readable by others.*chmod 600"):
        open_store(tmp_path / "store")


@pytest.mark.parametrize("value", ["short", "zz" * 32])
def test_a_bad_key_in_the_environment_is_refused_without_showing_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TP_CHECKPOINT_SIGNING_KEY", value)
    with pytest.raises(CheckpointError, match="TP_CHECKPOINT_SIGNING_KEY must be at least 64 hex digits") as error:
        open_store(tmp_path / "store")
    assert value not in str(error.value)


def test_the_key_never_appears_in_a_manifest_or_a_store_repr(store, tmp_path):
    manifest, _ = store.save("r", 1, state(1.0))
    key_hex = os.environ["TP_CHECKPOINT_SIGNING_KEY"]
    stored = (tmp_path / "store" / manifest_key("r", 1)).read_text()
    assert key_hex not in stored and key_hex not in repr(store.signer) and key_hex not in repr(store.__dict__)
    assert (tmp_path / "store" / chunk_key(manifest.skeleton.digest)).exists()


def test_checkpoints_written_before_signing_are_signed_once_checked(store, tmp_path, capsys):
    from training_platform.checkpoints.adopt import main

    for step in (1, 2):
        store.save("r", step, state(float(step)))
        body = json.loads(store.storage.get(manifest_key("r", step)))
        body.pop("signature")
        store.storage.put(manifest_key("r", step), json.dumps(body).encode())  # as an older build wrote it
    damaged = store.list("r")[1]
    (tmp_path / "store" / chunk_key(damaged.tensors[0].chunks[0].digest)).write_bytes(b"rot")
    with pytest.raises(CheckpointError, match="none restores.*is not signed"):
        store.restore_latest("r")

    assert main([str(tmp_path / "store")]) == 1  # one was left unsigned

    out = capsys.readouterr().out
    assert "r: signed steps [1]" in out and "r: step 2 left unsigned: chunk" in out
    restored = store.restore_latest("r")
    assert restored.manifest.step == 1 and torch.equal(restored.state["w"], state(1.0)["w"])
    assert "is not signed" in restored.skipped[0][1]
