"""A node-local shard cache shared by a user's jobs on the node, content-addressed by shard sha256.

Two jobs reading the same snapshot (or two snapshots sharing shards) fetch each shard once:
the cache file is named by the hash of its bytes, filled only from bytes already verified
against the manifest, and published by an atomic rename, so concurrent fillers race safely.

The default directory has a predictable name in the node's shared temp space, so the cache is
used only when it is a real directory owned by this user and writable by no one else (another
user could create it first), and a hit is served only when its bytes hash to the manifest's.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from training_platform.datasets.manifest import ShardRef
from training_platform.datasets.store import SnapshotRoot, file_sha256, read_shard_bytes
from training_platform.errors import SnapshotError

CACHE_ENV = "TP_SHARD_CACHE"


def default_cache_dir() -> Path:
    """``$TP_SHARD_CACHE``, else a per-user directory in the node's temp space (not the shared home)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(tempfile.gettempdir()) / f"tp-shard-cache-{os.getuid()}"


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0


class ShardCache:
    """``path(snapshot_root, snapshot_id, ref)`` returns a local, verified copy of the shard."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.stats = CacheStats()
        self._private = False

    def entry(self, ref: ShardRef) -> Path:
        return self.root / ref.sha256[:2] / f"{ref.sha256}.parquet"

    def path(self, snapshot_root: SnapshotRoot, snapshot_id: str, ref: ShardRef) -> Path:
        if not self._private:
            ensure_private_dir(self.root)
            self._private = True
        cached = self.entry(ref)
        # A hit is hashed: the reader reads the whole shard next anyway, so this costs one read from
        # the page cache, and a damaged or planted entry is replaced instead of trained on.
        if cached.is_file() and cached.stat().st_size == ref.bytes and file_sha256(cached) == ref.sha256:
            self.stats.hits += 1
            return cached
        data = read_shard_bytes(snapshot_root, snapshot_id, ref)  # raises on a corrupt source shard
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=f".{cached.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, cached)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.stats.misses += 1
        self.stats.bytes_fetched += len(data)
        return cached

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("*/*.parquet")) if self.root.is_dir() else 0

    def evict_to(self, max_bytes: int) -> int:
        """Delete least recently used entries until the cache holds at most max_bytes; returns files removed."""
        entries = sorted(self.root.glob("*/*.parquet"), key=lambda p: p.stat().st_atime) if self.root.is_dir() else []
        total, removed = sum(p.stat().st_size for p in entries), 0
        for path in entries:
            if total <= max_bytes:
                break
            total -= path.stat().st_size
            path.unlink(missing_ok=True)  # a reader that opened it keeps its handle
            removed += 1
        return removed


def ensure_private_dir(path: Path) -> None:
    """Create `path` (mode 700), or refuse (SnapshotError) one that another user owns or could write to."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # checked below, whoever made it
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory (a link or a file)"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise SnapshotError(
            f"shard cache {path} {problem}: anyone who can write there can change the data you train on; "
            f"remove it, or set {CACHE_ENV} to a directory of your own"
        )

