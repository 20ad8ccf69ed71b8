"""Where snapshots live (a directory, or an S3 prefix), and the only code that writes or verifies them.

Layout under a root (a local directory, or ``s3://bucket/prefix`` where a second machine must read them):

    root/shards/<sha256>.parquet   immutable shards, named by the hash of their bytes
    root/<snapshot_id>.json        manifests, written last; a snapshot exists once its manifest does

Every write is atomic: a local file goes to a temporary name, is fsynced, then renamed into place; an S3
PUT is whole or absent. A crash leaves either the old state or the new one, never a torn object under a
final name. Reads verify each shard's hash before anyone parses it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from training_platform.checkpoints.backends import open_storage
from training_platform.checkpoints.storage import Buffer, LocalStorage, Storage
from training_platform.datasets.manifest import FORMAT_VERSION, ShardRef, SnapshotManifest
from training_platform.errors import CheckpointError, SnapshotError

SHARD_DIR = "shards"
_SNAPSHOT_ID = re.compile(r"^[0-9a-f]{64}$")

SnapshotRoot = Path | str
"""A directory, or an ``s3://bucket/prefix`` URI (the S3 endpoint and credentials from the environment)."""
_T = TypeVar("_T")
_P = ParamSpec("_P")


def _store_errors(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """A store that cannot be reached (S3 down, no such bucket, no access) is a snapshot error, naming the root."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return function(*args, **kwargs)
        except CheckpointError as exc:  # what the storage tiers raise once their retries are spent
            raise SnapshotError(f"the snapshot store {args[0]} failed: {exc}") from None

    return wrapper


def snapshot_storage(root: SnapshotRoot) -> Storage:
    """The storage under `root`; one client per root and process (a forked data loader makes its own)."""
    return _storage(str(root), os.getpid())


@functools.lru_cache(maxsize=16)
def _storage(root: str, _pid: int) -> Storage:
    return open_storage(root)


@_store_errors
def write_shard(root: SnapshotRoot, data: Buffer, rows: int) -> ShardRef:
    """Store shard bytes under their hash; an intact existing copy is left untouched. Its name in the
    shard directory is made durable by write_manifest, once for all of a snapshot's shards."""
    sha256 = hashlib.sha256(data).hexdigest()
    ref = ShardRef(path=f"{SHARD_DIR}/{sha256}.parquet", rows=rows, bytes=len(data), sha256=sha256)
    storage = snapshot_storage(root)
    # Content addressed: same name means same bytes, so only a damaged copy is ever replaced.
    if not _intact(storage, ref):
        storage.put(ref.path, data, sync_parent=False)
    return ref


def _intact(storage: Storage, ref: ShardRef) -> bool:
    """A stored shard with the ref's bytes: hashed on disk, where a file can be damaged in place; an S3 object
    is whole or absent, and its name is the hash of what was PUT, so its size is all that is left to check."""
    info = storage.stat(ref.path)
    if info is None or info.size != ref.bytes:
        return False
    if isinstance(storage, LocalStorage):
        return file_sha256(storage.root / ref.path) == ref.sha256
    return True


@_store_errors
def write_manifest(root: SnapshotRoot, manifest: SnapshotManifest) -> SnapshotManifest:
    """Seal and publish a manifest (after its shards are durable); an identical one is left untouched."""
    sealed = manifest.sealed()
    storage = snapshot_storage(root)
    key = _manifest_key(sealed.snapshot_id)
    data = sealed.to_json().encode()
    storage.sync(SHARD_DIR)  # the shards' names are durable before a manifest names them
    if _get(storage, key) != data:
        storage.put(key, data)
    return sealed


def _manifest_key(snapshot_id: str) -> str:
    return f"{snapshot_id}.json"


def _get(storage: Storage, key: str) -> bytes | None:
    try:
        return storage.get(key)
    except FileNotFoundError:
        return None


@_store_errors
def load_manifest(root: SnapshotRoot, snapshot_id: str) -> SnapshotManifest:
    """Load and verify a snapshot's manifest."""
    # The id check also keeps a crafted id from naming a key outside root.
    data = _get(snapshot_storage(root), _manifest_key(snapshot_id)) if _SNAPSHOT_ID.match(snapshot_id) else None
    if data is None:
        raise SnapshotError(
            f"snapshot {snapshot_id} not found under {root}; build one with "
            f"build_snapshot('sklearn_digits', root) (or `tp demo`) or check the id"
        )
    origin = f"{root}/{_manifest_key(snapshot_id)}"
    manifest = SnapshotManifest.from_json(data, origin=origin)
    if manifest.format_version > FORMAT_VERSION:
        raise SnapshotError(
            f"snapshot {snapshot_id} uses manifest format {manifest.format_version}, newer than this "
            f"version of training_platform supports ({FORMAT_VERSION}); upgrade training_platform"
        )
    if manifest.snapshot_id != snapshot_id or manifest.content_hash() != snapshot_id:
        raise SnapshotError(
            f"manifest {origin} does not match snapshot id {snapshot_id}: it was edited or corrupted; "
            f"delete it and rebuild the snapshot"
        )
    return manifest


@_store_errors
def list_snapshots(root: SnapshotRoot) -> list[SnapshotManifest]:
    """Every verified snapshot under root, oldest manifest first (ties by id)."""
    storage = snapshot_storage(root)
    if isinstance(storage, LocalStorage):  # a glob of the top level, not a walk of every shard
        found = [(path.stat().st_mtime, path.name) for path in storage.root.glob("*.json")]
    else:
        found = [(info.modified, info.key) for info in storage.list_info("")]
    ids = sorted((modified, key[: -len(".json")]) for modified, key in found if _is_manifest_key(key))
    return [load_manifest(root, snapshot_id) for _, snapshot_id in ids]


def _is_manifest_key(key: str) -> bool:
    return key.endswith(".json") and bool(_SNAPSHOT_ID.match(key[: -len(".json")]))


@_store_errors
def read_shard_bytes(root: SnapshotRoot, snapshot_id: str, ref: ShardRef) -> bytes:
    """A shard's bytes, verified against the manifest before anyone parses them."""
    where = f"{root}/{ref.path}"
    try:
        data = snapshot_storage(root).get(ref.path)
    except FileNotFoundError:
        raise SnapshotError(
            f"shard {where} of snapshot {snapshot_id} is missing; rebuild the snapshot to restore it"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref.sha256:
        raise SnapshotError(
            f"shard {where} of snapshot {snapshot_id} is corrupted (sha256 {actual}, expected "
            f"{ref.sha256}); rebuild the snapshot to restore it"
        )
    return data


@_store_errors
def put_object(root: SnapshotRoot, key: str, data: bytes) -> None:
    """Store a file that belongs beside the snapshots (a text snapshot's tokenizer), atomically."""
    snapshot_storage(root).put(key, data)


@_store_errors
def get_object(root: SnapshotRoot, key: str) -> bytes | None:
    """A file stored with put_object, or None."""
    return _get(snapshot_storage(root), key)


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
