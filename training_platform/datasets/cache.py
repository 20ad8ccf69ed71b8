"""A node-local shard cache shared by every job on the node, content-addressed by shard sha256.

Two jobs reading the same snapshot (or two snapshots sharing shards) fetch each shard once:
the cache file is named by the hash of its bytes, filled only from bytes already verified
against the manifest, and published by an atomic rename, so concurrent fillers race safely.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from training_platform.datasets.manifest import ShardRef
from training_platform.datasets.store import read_shard_bytes

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

    def entry(self, ref: ShardRef) -> Path:
        return self.root / ref.sha256[:2] / f"{ref.sha256}.parquet"

    def path(self, snapshot_root: Path, snapshot_id: str, ref: ShardRef) -> Path:
        cached = self.entry(ref)
        # Entries are created only from verified bytes and never rewritten, so the size is
        # enough to catch a truncated disk; re-hashing on every read would cost a full read.
        if cached.is_file() and cached.stat().st_size == ref.bytes:
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
