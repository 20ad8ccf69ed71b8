"""Where snapshots live on disk, and the only code that writes or verifies their files.

Layout under a root directory:

    root/shards/<sha256>.parquet   immutable shards, named by the hash of their bytes
    root/<snapshot_id>.json        manifests, written last; a snapshot exists once its manifest does

Writes go to a temporary file, are fsynced, then renamed into place, so a crash leaves either
the old state or the new one, never a torn file under a final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from training_platform.datasets.manifest import FORMAT_VERSION, ShardRef, SnapshotManifest
from training_platform.errors import SnapshotError

SHARD_DIR = "shards"
_SNAPSHOT_ID = re.compile(r"^[0-9a-f]{64}$")


def manifest_path(root: Path, snapshot_id: str) -> Path:
    return Path(root) / f"{snapshot_id}.json"


def write_shard(root: Path, data: bytes, rows: int) -> ShardRef:
    """Store shard bytes under their hash; an intact existing copy is left untouched."""
    sha256 = hashlib.sha256(data).hexdigest()
    ref = ShardRef(path=f"{SHARD_DIR}/{sha256}.parquet", rows=rows, bytes=len(data), sha256=sha256)
    path = Path(root) / ref.path
    # Content addressed: same name means same bytes, so only a damaged copy is ever replaced.
    if not (path.exists() and file_sha256(path) == sha256):
        _write_atomic(path, data)
    return ref


def write_manifest(root: Path, manifest: SnapshotManifest) -> SnapshotManifest:
    """Seal and publish a manifest (after its shards are durable); an identical one is left untouched."""
    sealed = manifest.sealed()
    path = manifest_path(root, sealed.snapshot_id)
    data = sealed.to_json().encode()
    if not (path.exists() and path.read_bytes() == data):
        _write_atomic(path, data)
    return sealed


def load_manifest(root: Path, snapshot_id: str) -> SnapshotManifest:
    """Load and verify a snapshot's manifest."""
    root = Path(root)
    path = manifest_path(root, snapshot_id)
    # The id check also keeps a crafted id from naming a path outside root.
    if not _SNAPSHOT_ID.match(snapshot_id) or not path.is_file():
        raise SnapshotError(
            f"snapshot {snapshot_id} not found under {root}; build one with "
            f"build_snapshot('sklearn_digits', root) (or `tp demo`) or check the id"
        )
    manifest = SnapshotManifest.from_json(path.read_bytes(), origin=str(path))
    if manifest.format_version > FORMAT_VERSION:
        raise SnapshotError(
            f"snapshot {snapshot_id} uses manifest format {manifest.format_version}, newer than this "
            f"version of training_platform supports ({FORMAT_VERSION}); upgrade training_platform"
        )
    if manifest.snapshot_id != snapshot_id or manifest.content_hash() != snapshot_id:
        raise SnapshotError(
            f"manifest {path} does not match snapshot id {snapshot_id}: it was edited or corrupted; "
            f"delete it and rebuild the snapshot"
        )
    return manifest


def list_snapshots(root: Path) -> list[SnapshotManifest]:
    """Every verified snapshot under root, oldest manifest first (ties by id)."""
    root = Path(root)
    if not root.is_dir():
        return []
    paths = [path for path in root.glob("*.json") if _SNAPSHOT_ID.match(path.stem)]
    paths.sort(key=lambda path: (path.stat().st_mtime_ns, path.stem))
    return [load_manifest(root, path.stem) for path in paths]


def read_shard_bytes(root: Path, snapshot_id: str, ref: ShardRef) -> bytes:
    """A shard's bytes, verified against the manifest before anyone parses them."""
    path = Path(root) / ref.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError(
            f"shard {path} of snapshot {snapshot_id} is missing; rebuild the snapshot to restore it"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref.sha256:
        raise SnapshotError(
            f"shard {path} of snapshot {snapshot_id} is corrupted (sha256 {actual}, expected "
            f"{ref.sha256}); rebuild the snapshot to restore it"
        )
    return data


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique temp name lets two builders of the same snapshot race safely: both rename identical bytes.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
