"""The streaming data path: rank sharding, per-epoch shuffle, mid-epoch resume, worker prefetch, node cache."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from training_platform.datasets import stream
from training_platform.datasets.builder import write_snapshot
from training_platform.datasets.cache import ShardCache
from training_platform.datasets.sources import RawSource
from training_platform.datasets.stream import StepBatches, StreamPlan, batch_loader
from training_platform.errors import SnapshotError
from training_platform.train.split_data import prefetch_workers

ROWS = 5000  # -> 5 train shards of about 700 rows


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("stream-snapshots")
    features = np.stack([np.arange(ROWS), np.arange(ROWS) % 7], axis=1).astype(np.int64)
    raw = RawSource(
        name="counting",
        features=features,
        labels=np.arange(ROWS) % 2,
        num_classes=2,
        feature_min=0,
        feature_max=ROWS,
    )
    order = np.arange(ROWS)
    splits = {
        "train": order[: ROWS * 7 // 10],
        "validation": order[ROWS * 7 // 10 :: 2],
        "test": order[ROWS * 7 // 10 + 1 :: 2],
    }
    return root, write_snapshot(root, raw, splits)


def _batches(snapshot, tmp_path, rank=0, world=1, batch=32, seed=3) -> StepBatches:
    root, manifest = snapshot
    plan = StreamPlan(tuple(r.rows for r in manifest.splits["train"]), batch, rank, world, seed)
    return StepBatches(root, manifest, "train", plan, columns=["feature_0"], cache=ShardCache(tmp_path / "cache"))


def test_ranks_read_disjoint_rows_and_step_together(snapshot, tmp_path):
    readers = [_batches(snapshot, tmp_path, rank, 3) for rank in range(3)]
    steps = readers[0].plan.steps_in_epoch(0)
    assert {r.plan.steps_in_epoch(0) for r in readers} == {steps} and steps > 0
    seen = [np.concatenate([r[s].numpy().ravel() for s in range(steps)]) for r in readers]
    everything = np.concatenate(seen)
    assert len(everything) == len(set(everything.tolist())) == 3 * steps * 32
    for rank, rows in enumerate(seen):  # each rank reads only from the shards it was given
        shards = set(readers[rank].plan.shards(0))
        assert shards.isdisjoint(set().union(*(readers[o].plan.shards(0) for o in range(3) if o != rank)))
        assert len(rows) == steps * 32


def test_shuffle_is_deterministic_per_epoch_and_differs_between_epochs(snapshot, tmp_path):
    a, b = _batches(snapshot, tmp_path), _batches(snapshot, tmp_path)
    steps = a.plan.steps_in_epoch(0)
    assert all(np.array_equal(a[s], b[s]) for s in range(steps + 3))
    first_epoch = np.concatenate([a[s].numpy().ravel() for s in range(steps)])
    second_epoch = np.concatenate([a[s].numpy().ravel() for s in range(steps, steps + a.plan.steps_in_epoch(1))])
    assert not np.array_equal(first_epoch[:64], second_epoch[:64])
    assert len(set(first_epoch.tolist())) == len(first_epoch)  # within an epoch, no row twice
    other_seed = _batches(snapshot, tmp_path, seed=4)
    assert not np.array_equal(a[0], other_seed[0])


def test_position_crosses_epochs(snapshot, tmp_path):
    plan = _batches(snapshot, tmp_path, 1, 2).plan
    first = plan.steps_in_epoch(0)
    assert plan.position(0) == (0, 0)
    assert plan.position(first - 1) == (0, first - 1)
    assert plan.position(first) == (1, 0)
    assert plan.position(first + plan.steps_in_epoch(1) + 2) == (2, 2)


def test_mid_epoch_resume_with_worker_prefetch_reads_the_same_batches(snapshot, tmp_path):
    reader = _batches(snapshot, tmp_path, 1, 2)
    total = reader.plan.steps_in_epoch(0) + 5  # across an epoch boundary
    straight = [b.clone() for b in batch_loader(reader, 0, total, workers=0)]
    resumed = [b.clone() for b in batch_loader(reader, 17, total, workers=2, prefetch=2)]
    assert len(resumed) == total - 17
    assert all(np.array_equal(x, y) for x, y in zip(straight[17:], resumed, strict=True))
    fresh = _batches(snapshot, tmp_path, 1, 2)
    list(batch_loader(fresh, 0, 4, workers=2))
    assert not fresh._decoded  # decoding happened in the worker processes, not in the trainer


def test_node_cache_is_shared_by_jobs_and_keyed_by_shard_hash(snapshot, tmp_path):
    root, manifest = snapshot
    first = _batches(snapshot, tmp_path)
    steps = first.plan.steps_in_epoch(0)
    for step in range(steps):
        first[step]
    shards = len(manifest.splits["train"])
    assert (first.cache.stats.misses, first.cache.stats.bytes_fetched) == (
        shards,
        sum(r.bytes for r in manifest.splits["train"]),
    )
    second = _batches(snapshot, tmp_path)  # another job on the node: same cache directory
    for step in range(steps):
        second[step]
    assert second.cache.stats.misses == 0 and second.cache.stats.hits == shards
    ref = manifest.splits["train"][0]
    assert first.cache.entry(ref).name == f"{ref.sha256}.parquet"


def test_cache_refetches_a_truncated_entry_and_refuses_a_corrupt_source(snapshot, tmp_path):
    root, manifest = snapshot
    ref = manifest.splits["train"][0]
    cache = ShardCache(tmp_path / "cache")
    entry = cache.path(root, manifest.snapshot_id, ref)
    entry.write_bytes(entry.read_bytes()[:10])
    assert cache.path(root, manifest.snapshot_id, ref).stat().st_size == ref.bytes
    assert cache.stats.misses == 2
    source = root / ref.path
    original = source.read_bytes()
    try:
        source.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        with pytest.raises(SnapshotError, match="corrupted"):
            ShardCache(tmp_path / "other-cache").path(root, manifest.snapshot_id, ref)
    finally:
        source.write_bytes(original)


def test_cache_eviction_keeps_the_newest(snapshot, tmp_path):
    root, manifest = snapshot
    cache = ShardCache(tmp_path / "cache")
    for ref in manifest.splits["train"]:
        cache.path(root, manifest.snapshot_id, ref)
    removed = cache.evict_to(cache.size_bytes() - 1)
    assert removed >= 1 and cache.size_bytes() < sum(r.bytes for r in manifest.splits["train"])


def test_decoded_shards_are_kept_within_the_byte_budget(snapshot, tmp_path, monkeypatch):
    decoded = []
    real_read = stream.pq.read_table
    monkeypatch.setattr(stream.pq, "read_table", lambda path, **kw: decoded.append(path) or real_read(path, **kw))
    roomy = _batches(snapshot, tmp_path, rank=0, world=2)
    three_epochs = sum(roomy.plan.steps_in_epoch(epoch) for epoch in range(3))
    for step in range(three_epochs):  # each epoch gives the rank other shards
        roomy[step]
    assert len(decoded) == len(set(decoded)) == len(roomy._decoded)  # every shard decoded once, all kept

    decoded.clear()
    one_shard = max(a.nbytes for a in roomy._decoded.values())
    tight = _batches(snapshot, tmp_path, rank=0, world=2)
    tight.keep_bytes = one_shard
    for step in range(three_epochs):
        tight[step]
    assert len(tight._decoded) == 1 and len(decoded) > len(set(decoded))  # evicted, decoded again
    assert all(np.array_equal(tight[s].numpy(), roomy[s].numpy()) for s in range(three_epochs))


def test_preload_decodes_a_split_that_fits_before_training_and_this_epochs_shards_of_one_that_does_not(
    snapshot, tmp_path, monkeypatch
):
    decoded = []
    real_read = stream.pq.read_table
    monkeypatch.setattr(stream.pq, "read_table", lambda path, **kw: decoded.append(path) or real_read(path, **kw))
    roomy = _batches(snapshot, tmp_path, rank=1, world=2)
    later = roomy.plan.steps_in_epoch(0) + 3  # resumed in the second epoch
    roomy.preload(later)
    assert len(decoded) == len(roomy.refs)  # the whole split, each shard once
    three_epochs = sum(roomy.plan.steps_in_epoch(epoch) for epoch in range(3))
    batches = [roomy[step].numpy() for step in range(three_epochs)]
    assert len(decoded) == len(roomy.refs)  # training decoded nothing more

    decoded.clear()
    tight = _batches(snapshot, tmp_path, rank=1, world=2)
    tight.keep_bytes = 2 * max(a.nbytes for a in roomy._decoded.values())
    tight.preload(later)
    this_epoch = tight.plan.shards(1)
    assert len(decoded) == 2 and set(tight._decoded) == set(this_epoch[:2])  # in reading order, within the budget
    assert all(np.array_equal(tight[s].numpy(), batches[s]) for s in range(three_epochs))


def test_plan_refuses_more_ranks_than_shards(snapshot, tmp_path):
    with pytest.raises(SnapshotError, match="fewer than 9 ranks"):
        _batches(snapshot, tmp_path, 0, 9)


def test_prefetch_workers_only_where_cores_are_spare():
    assert prefetch_workers(procs_per_node=2, cores=2) == 0  # every core runs a rank
    assert prefetch_workers(procs_per_node=1, cores=2) == 1
    assert prefetch_workers(procs_per_node=8, cores=96) == 2  # a GPU node: capped


def test_a_cache_directory_another_user_could_write_is_refused(snapshot, tmp_path):
    # The reported attack: /tmp/tp-shard-cache-<uid> created first by someone else, world-writable.
    root, manifest = snapshot
    ref = manifest.splits["train"][0]
    planted = tmp_path / "tp-shard-cache-0"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(SnapshotError, match=r"shard cache .* is writable by others \(mode 777\).*TP_SHARD_CACHE"):
        ShardCache(planted).path(root, manifest.snapshot_id, ref)
    os.chown(planted, 65534, 65534)  # owned by nobody
    planted.chmod(0o700)
    with pytest.raises(SnapshotError, match="belongs to uid 65534"):
        ShardCache(planted).path(root, manifest.snapshot_id, ref)
    fresh = tmp_path / "fresh-cache"
    ShardCache(fresh).path(root, manifest.snapshot_id, ref)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


def test_a_poisoned_entry_of_the_right_size_is_never_served(snapshot, tmp_path):
    root, manifest = snapshot
    ref = manifest.splits["train"][0]
    cache = ShardCache(tmp_path / "cache")
    entry = cache.entry(ref)
    entry.parent.mkdir(parents=True)
    (tmp_path / "cache").chmod(0o700)
    entry.write_bytes(b"\0" * ref.bytes)  # same size, other bytes: a size check alone served it
    served = cache.path(root, manifest.snapshot_id, ref)
    assert hashlib.sha256(served.read_bytes()).hexdigest() == ref.sha256
    assert cache.stats.misses == 1 and cache.stats.hits == 0
