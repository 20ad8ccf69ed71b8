"""Dataset snapshots in an S3 bucket (TP_SNAPSHOT_STORE_URI), on a real S3 server: the same snapshot as on disk,
a second build that writes nothing, a damaged shard that is never parsed, and the readers training uses."""

from __future__ import annotations

import numpy as np
import pytest

from training_platform.checkpoints.s3 import S3Storage
from training_platform.datasets import build_snapshot, list_snapshots, load_manifest, read_split
from training_platform.datasets.cache import ShardCache
from training_platform.datasets.text import load_tokenizer
from training_platform.errors import SnapshotError
from training_platform.launch.job_env import job_environment
from training_platform.paths import PlatformHome

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket_root(s3_bucket) -> str:
    return f"s3://{s3_bucket}/team-a/snapshots"


def test_a_snapshot_in_the_bucket_is_the_one_on_disk_and_reads_the_same(bucket_root, tmp_path):
    on_disk = build_snapshot("sklearn_digits", tmp_path)
    in_bucket = build_snapshot("sklearn_digits", bucket_root)
    assert in_bucket.snapshot_id == on_disk.snapshot_id  # content-addressed wherever it is stored
    assert [m.snapshot_id for m in list_snapshots(bucket_root)] == [in_bucket.snapshot_id]
    assert load_manifest(bucket_root, in_bucket.snapshot_id) == in_bucket
    for split in in_bucket.split_names:
        for ours, theirs in zip(
            read_split(bucket_root, in_bucket.snapshot_id, split),
            read_split(tmp_path, on_disk.snapshot_id, split),
            strict=True,
        ):
            np.testing.assert_array_equal(ours, theirs)
    # Training reads shards through the node's cache: a local, verified copy of the bucket's object.
    ref = in_bucket.splits["train"][0]
    cached = ShardCache(tmp_path / "cache").path(bucket_root, in_bucket.snapshot_id, ref)
    assert cached.is_file() and cached.read_bytes() == (tmp_path / ref.path).read_bytes()


def test_a_second_build_writes_nothing(bucket_root, monkeypatch):
    first = build_snapshot("sklearn_digits", bucket_root)
    puts: list[str] = []
    original = S3Storage.put

    def counted(self, key, data, **kwargs):
        puts.append(key)
        return original(self, key, data, **kwargs)

    monkeypatch.setattr(S3Storage, "put", counted)
    again = build_snapshot("sklearn_digits", bucket_root)
    assert again == first and puts == []


def test_a_damaged_shard_in_the_bucket_is_refused_and_a_rebuild_repairs_it(bucket_root, s3_server):
    manifest = build_snapshot("sklearn_digits", bucket_root)
    bucket, prefix = bucket_root.removeprefix("s3://").split("/", 1)
    ref = manifest.splits["validation"][0]
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{ref.path}", Body=b"not a parquet file")
    with pytest.raises(SnapshotError, match=f"shard {bucket_root}/{ref.path} of snapshot .* is corrupted"):
        read_split(bucket_root, manifest.snapshot_id, "validation")
    build_snapshot("sklearn_digits", bucket_root)  # the damaged object's size differs: it is written again
    features, _ = read_split(bucket_root, manifest.snapshot_id, "validation")
    assert len(features) == manifest.rows["validation"]


def test_an_unknown_snapshot_store_or_bucket_names_the_fix(bucket_root):
    with pytest.raises(SnapshotError, match=f"snapshot {'0' * 64} not found under {bucket_root}"):
        load_manifest(bucket_root, "0" * 64)
    with pytest.raises(SnapshotError, match="use a directory or s3://bucket/prefix"):
        list_snapshots("gs://bucket/snapshots")
    missing = "s3://tp-no-such-bucket/snapshots"
    with pytest.raises(SnapshotError, match=f"the snapshot store {missing} failed: .*bucket exists"):
        list_snapshots(missing)


def test_a_text_snapshot_keeps_its_tokenizer_in_the_bucket(bucket_root):
    manifest = build_snapshot("python_stdlib_text", bucket_root)
    assert load_tokenizer(bucket_root, manifest).vocab_size == manifest.num_classes


def test_the_home_and_every_job_find_the_bucket_through_one_setting(bucket_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TP_HOME", str(tmp_path))
    monkeypatch.setenv("TP_SNAPSHOT_STORE_URI", bucket_root)
    home = PlatformHome.from_env().ensure()
    assert home.snapshots == bucket_root and not (tmp_path / "snapshots").exists()
    assert job_environment({"TP_SNAPSHOT_STORE_URI": bucket_root})["TP_SNAPSHOT_STORE_URI"] == bucket_root
    monkeypatch.setenv("TP_SNAPSHOT_STORE_URI", str(tmp_path / "shared"))
    assert PlatformHome.from_env().snapshots == tmp_path / "shared"


def test_a_teams_own_files_in_a_bucket_become_a_snapshot_found_again_without_a_read(
    s3_server, s3_bucket, tmp_path, monkeypatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training_platform.datasets.files import FileSource, build_file_snapshot
    from training_platform.spec.file_source import FileColumns

    client = s3_server.client()
    rows = np.arange(300)
    for index, part in enumerate(np.array_split(rows, 2)):
        local = tmp_path / f"part-{index}.parquet"
        pq.write_table(pa.table({"x": part * 0.5, "y": part % 3}), local)
        client.upload_file(str(local), s3_bucket, f"landing/events/part-{index}.parquet")
    client.put_object(Bucket=s3_bucket, Key="landing/events/_SUCCESS", Body=b"")
    source = FileSource(uri=f"s3://{s3_bucket}/landing/events/*.parquet", columns=FileColumns(label="y"))
    first = build_file_snapshot(source, tmp_path / "snap")
    assert first.parsed and first.manifest.total_rows == 300 and first.manifest.num_classes == 3
    assert [file.name for file in first.files] == [
        f"s3://{s3_bucket}/landing/events/part-{index}.parquet" for index in (0, 1)
    ]
    gets: list[str] = []
    original = S3Storage.get
    monkeypatch.setattr(S3Storage, "get", lambda self, key: gets.append(key) or original(self, key))
    again = build_file_snapshot(source, tmp_path / "snap")
    assert (again.manifest, again.parsed, gets) == (first.manifest, False, [])  # listed, not read

    # A bucket the platform cannot list (here: none of that name): one line naming the source and what to check.
    missing = FileSource(uri=f"s3://{s3_bucket}-gone/landing/*.parquet", columns=FileColumns(label="y"))
    with pytest.raises(
        SnapshotError,
        match=rf"dataset.source s3://{s3_bucket}-gone/landing/\*.parquet cannot be "
        r"listed .*check the bucket and prefix, and that the platform's S3",
    ):
        build_file_snapshot(missing, tmp_path / "snap")


@pytest.fixture(scope="module")
def guarded_s3(tmp_path_factory):
    """An S3 server of its own that checks credentials: `lister` may list the landing bucket but read nothing,
    `outsider` may do nothing there."""
    from tests.fixtures.s3 import S3Server

    server = S3Server(tmp_path_factory.mktemp("guarded-s3"), identities={
        "lister": ["List:landing"], "outsider": ["Read:elsewhere", "List:elsewhere"]})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_an_s3_prefix_that_denies_access_is_refused_before_a_build_names_what_to_grant(
    guarded_s3, tmp_path, monkeypatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training_platform.datasets.files import FileSource, build_file_snapshot, check_source
    from training_platform.spec.file_source import FileColumns

    client = guarded_s3.client()
    client.create_bucket(Bucket="landing")
    pq.write_table(pa.table({"x": [0.5, 1.5, 2.5, 3.5], "y": [0, 1, 0, 1]}), tmp_path / "part-0.parquet")
    client.upload_file(str(tmp_path / "part-0.parquet"), "landing", "events/part-0.parquet")
    source = FileSource(uri="s3://landing/events/", columns=FileColumns(label="y"))

    denials = {
        "outsider": r"dataset.source s3://landing/events/ cannot be listed \(S3 listing of s3://landing/events/ was "
                    r"denied \(AccessDenied\): the credentials .*check the bucket and prefix, and that the platform",
        "lister": r"dataset.source s3://landing/events/: s3://landing/events/part-0.parquet cannot be read \(S3 .* "
                  r"was denied \((403|AccessDenied)\).*check the platform's access to it",
    }
    for identity, message in denials.items():
        for name, value in guarded_s3.identity_env(identity).items():
            monkeypatch.setenv(name, value)
        for step in (check_source, lambda source: build_file_snapshot(source, tmp_path / "snap")):
            with pytest.raises(SnapshotError, match=message):
                step(source)
    assert not (tmp_path / "snap").exists() or not any((tmp_path / "snap").rglob("*.json"))  # nothing published
