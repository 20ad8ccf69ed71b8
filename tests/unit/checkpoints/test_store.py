"""CheckpointStore on a local directory: roundtrip, chunking, dedup, verification, fallback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import blake3
import numpy as np
import pytest
import torch

from training_platform.checkpoints import CheckpointStore, open_store
from training_platform.checkpoints.adopt import adopt_unsigned
from training_platform.checkpoints.layout import chunk_key, manifest_key
from training_platform.checkpoints.manifest import FORMAT_VERSION, READABLE_FORMATS, UNPACKED_FORMAT, ChunkRef
from training_platform.checkpoints.storage import LocalStorage
from training_platform.errors import CheckpointError

# The files of chunks stored on their own, as on S3 (packs.py has the packed layout's tests).
pytestmark = pytest.mark.usefixtures("loose_chunks")

# Written by the format-2 build (901a356) with small_chunks:
# store.save("format2-run", 7, make_state(0), metrics={"loss": 0.5}).
FORMAT_2_STORE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoint_format2"


def make_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "big": torch.randn(3000, generator=g),  # 12 KB: three 4 KB chunks with small_chunks
            "small": torch.randn(7, generator=g),
            "half": torch.randn(5, 5, generator=g).to(torch.bfloat16),
            "transposed": torch.randn(4, 6, generator=g).t(),
            "empty": torch.empty(0, 3),
            "ints": torch.arange(10, dtype=torch.int64),
            "mask": torch.tensor([True, False]),
        },
        "optim": [{"step": 3, "lr": 0.1}],
        "numpy": np.arange(4, dtype=np.float32),
        "meta": ("text", None, 2.5, b"raw"),
    }


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@pytest.fixture
def store(tmp_path, small_chunks) -> CheckpointStore:
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    return store


def test_roundtrip_is_bitwise_and_large_tensors_are_chunked(store):
    state = make_state()
    manifest, stats = store.save("run-a", 10, state, {"loss": 1.5})
    big = next(t for t in manifest.tensors if t.shape == [3000])
    assert len(big.chunks) == 3 and stats.bytes_written == manifest.total_bytes
    restored = store.restore_latest("run-a")
    assert restored.manifest.step == 10 and restored.skipped == []
    assert_same(state, restored.state)
    assert restored.manifest.summary()["bytes_written"] == stats.bytes_written


def test_unchanged_tensors_are_not_written_again(store):
    state = make_state()
    store.save("run-a", 1, state)
    state["model"]["big"][:10] += 1  # only the first 4 KB chunk of `big` changes
    manifest, stats = store.save("run-a", 2, state)
    assert stats.bytes_written == 4096 + manifest.skeleton.size or stats.bytes_written < 4096 * 2
    assert stats.bytes_deduplicated >= 2 * 4096
    assert_same(state, store.load(manifest))


def test_dedup_across_runs_shares_chunks(store):
    store.save("run-a", 1, make_state())
    _, stats = store.save("run-b", 1, make_state())
    assert stats.bytes_written == 0


def test_list_is_per_run_and_ordered(store):
    for step in (3, 1, 2):
        store.save("run-a", step, make_state(step))
    store.save("run-b", 9, make_state())
    assert [m.step for m in store.list("run-a")] == [1, 2, 3]
    assert store.run_ids() == ["run-a", "run-b"]
    assert store.restore_latest("missing") is None


def test_a_corrupted_chunk_is_named_and_restore_falls_back(store, tmp_path):
    store.save("run-a", 1, make_state(1))
    newest, _ = store.save("run-a", 2, make_state(2))
    big = next(t for t in newest.tensors if t.shape == [3000])
    path = tmp_path / "store" / chunk_key(big.chunks[1].digest)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    restored = store.restore_latest("run-a")
    assert restored.manifest.step == 1
    assert_same(make_state(1), restored.state)
    [(step, reason)] = restored.skipped
    assert step == 2 and big.chunks[1].digest in reason and "blake3 hash" in reason


def test_an_edited_manifest_is_detected_and_restore_falls_back(store, tmp_path):
    store.save("run-a", 1, make_state(1))
    store.save("run-a", 2, make_state(2), {"loss": 1.0})
    path = tmp_path / "store" / manifest_key("run-a", 2)
    body = json.loads(path.read_text())
    body["metrics"]["loss"] = 0.01  # a "better" checkpoint, forged
    path.write_text(json.dumps(body))
    restored = store.restore_latest("run-a")
    assert restored.manifest.step == 1
    assert "000000000002.json" in restored.skipped[0][1] and "sha256" in restored.skipped[0][1]


def test_a_missing_chunk_or_truncated_manifest_falls_back(store, tmp_path):
    store.save("run-a", 1, make_state(1))
    m2, _ = store.save("run-a", 2, make_state(2))
    store.save("run-a", 3, make_state(3))
    (tmp_path / "store" / manifest_key("run-a", 3)).write_text('{"run_id": "run-a", "st')
    big = next(t for t in m2.tensors if t.shape == [3000])
    (tmp_path / "store" / chunk_key(big.chunks[0].digest)).unlink()
    restored = store.restore_latest("run-a")
    assert restored.manifest.step == 1
    assert [step for step, _ in restored.skipped] == [3, 2]
    assert "unreadable" in restored.skipped[0][1] and "missing" in restored.skipped[1][1]


def test_bad_run_ids_are_refused_before_anything_is_written(store, tmp_path):
    with pytest.raises(ValueError, match="invalid storage key"):
        store.save("../escape", 1, make_state())
    assert not (tmp_path / "store" / "chunks").exists()


def test_unsupported_state_types_are_refused_with_the_type(store):
    with pytest.raises(TypeError, match="cannot checkpoint a object"):
        store.save("run-a", 1, {"x": object()})


def test_open_store_refuses_unknown_schemes(tmp_path):
    with pytest.raises(CheckpointError, match="unsupported"):
        open_store("gs://bucket/x")
    assert isinstance(open_store(f"file://{tmp_path}").storage, LocalStorage)


def test_files_checkpoint_roundtrip(store, tmp_path):
    src = tmp_path / "ds"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(bytes(range(256)) * 50)
    (src / "sub" / "b.txt").write_text("hello")
    files = {str(p.relative_to(src)): p for p in src.rglob("*") if p.is_file()}
    manifest, _ = store.save_files("run-f", 5, files, attributes={"format": "deepspeed"})
    with pytest.raises(CheckpointError, match="restore_files"):
        store.load(manifest)
    out = store.restore_files(store.list("run-f")[-1], tmp_path / "out")
    assert (tmp_path / "out" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert out["sub/b.txt"].read_text() == "hello"


def test_run_summary_reports_overhead_as_a_fraction_of_training_time(store):
    from training_platform.checkpoints.manifest import run_checkpoint_summary

    store.save("run-a", 1, make_state(), stall_seconds=0.5)
    manifest, _ = store.save("run-a", 2, make_state(), stall_seconds=1.5)
    summary = run_checkpoint_summary(store.list("run-a"), training_seconds=100.0)
    assert summary["checkpoint_overhead_fraction"] == 0.02 and summary["checkpoints"] == 2
    assert manifest.summary()["stall_seconds"] == 1.5 and manifest.summary()["tier"] == "hot"


def test_a_synchronous_save_records_its_own_time_as_its_stall(store):
    """The caller waited for all of it: a run saving synchronously must not read as checkpointing for free."""
    import time

    started = time.monotonic()
    manifest, stats = store.save("run-a", 1, make_state())
    took = time.monotonic() - started
    assert 0 < manifest.save.stall_seconds <= took and stats.stall_seconds == manifest.save.stall_seconds
    assert manifest.save.background_seconds == 0  # `every_steps: auto` adds the two: counted once
    assert store.list("run-a")[-1].save.stall_seconds == manifest.save.stall_seconds


def test_chunks_are_named_by_blake3_and_stored_under_that_name(store, tmp_path):
    manifest, _ = store.save("run-a", 1, make_state())
    stored = json.loads((tmp_path / "store" / manifest_key("run-a", 1)).read_text())
    assert manifest.format_version == UNPACKED_FORMAT
    assert set(stored["skeleton"]) == {"blake3", "size"}
    for ref in manifest.chunks:
        data = (tmp_path / "store" / chunk_key(ref.digest)).read_bytes()
        assert ref.algorithm == "blake3" and ref.digest == blake3.blake3(data).hexdigest()


def test_a_format_2_checkpoint_still_restores_and_new_saves_beside_it_use_a_newer_format(tmp_path, small_chunks):
    shutil.copytree(FORMAT_2_STORE, tmp_path / "store")
    store = open_store(tmp_path / "store")
    store.lease_settle_seconds = 0.0
    assert adopt_unsigned(store, "format2-run").signed == [7]  # written before manifests were signed
    old = store.restore_latest("format2-run")
    assert old.manifest.format_version == 2 and {ref.algorithm for ref in old.manifest.chunks} == {"sha256"}
    assert_same(make_state(0), old.state)
    assert old.manifest.metrics == {"loss": 0.5}

    store.save("format2-run", 8, make_state(1))
    store.gc(grace_seconds=0)
    assert_same(make_state(0), store.load(old.manifest)), "GC keeps the chunks of a kept format-2 checkpoint"
    store.prune("format2-run", keep_last=1)
    store.gc(grace_seconds=0)
    assert not any((tmp_path / "store" / chunk_key(ref.digest)).exists() for ref in old.manifest.chunks), (
        "GC removes the old format's chunks once no manifest needs them"
    )
    new = store.restore_latest("format2-run")
    assert new.manifest.step == 8 and new.manifest.format_version == UNPACKED_FORMAT
    assert_same(make_state(1), new.state)


def test_a_corrupted_format_2_chunk_is_caught_by_its_sha256(tmp_path):
    shutil.copytree(FORMAT_2_STORE, tmp_path / "store")
    store = open_store(tmp_path / "store")
    adopt_unsigned(store, "format2-run")
    [manifest] = store.list("format2-run")
    big = next(t for t in manifest.tensors if t.shape == [3000])
    path = tmp_path / "store" / chunk_key(big.chunks[0].digest)
    path.write_bytes(b"\0" + path.read_bytes()[1:])
    with pytest.raises(CheckpointError, match="does not match its sha256 hash"):
        store.load(manifest)


def test_a_chunk_reference_names_exactly_one_hash():
    assert ChunkRef.model_validate({"sha256": "a" * 64, "size": 1}).algorithm == "sha256"
    with pytest.raises(ValueError, match="exactly one hash"):
        ChunkRef.model_validate({"sha256": "a" * 64, "blake3": "b" * 64, "size": 1})
    with pytest.raises(ValueError, match="exactly one hash"):
        ChunkRef.model_validate({"md5": "a" * 32, "size": 1})


@pytest.mark.parametrize("shape", ["same", "new"], ids=["parses", "does-not-parse"])
def test_a_run_with_a_checkpoint_of_a_newer_format_is_left_alone(store, tmp_path, shape):
    """Resuming from an older checkpoint would save over the newer one; GC must keep its chunks."""
    store.save("run-a", 1, make_state(1))
    newer, _ = store.save("run-a", 2, make_state(2))
    only_listed_there = b"a chunk the newer format lists in a field this build does not know"
    digest = blake3.blake3(only_listed_there).hexdigest()
    store.storage.put(chunk_key(digest), only_listed_there)
    path = tmp_path / "store" / manifest_key("run-a", 2)
    newer_format = FORMAT_VERSION + 1
    extra = [{"blake3": digest, "size": 66}]
    body = json.loads(path.read_text()) | {"format_version": newer_format, "extra_chunks": extra}
    text = json.dumps(body) if shape == "same" else json.dumps(body).replace('"blake3"', '"b4"')
    path.write_text(text)

    readable = ", ".join(map(str, READABLE_FORMATS))
    fix = rf"cannot read at step 2: checkpoint format {newer_format} is newer than this build reads \({readable}\)"
    with pytest.raises(CheckpointError, match=fix):
        store.restore_latest("run-a")
    with pytest.raises(CheckpointError, match=fix):
        store.prune("run-a", keep_last=1)
    report = store.gc(grace_seconds=0)  # goes on, keeping every chunk the newer manifest names
    assert "upgrade training_platform" in report.skipped[f"{store.uri}/{manifest_key('run-a', 2)}"]
    assert path.read_text() == text
    for key in [chunk_key(digest)] + [chunk_key(ref.digest) for ref in newer.chunks]:
        assert (tmp_path / "store" / key).exists()
