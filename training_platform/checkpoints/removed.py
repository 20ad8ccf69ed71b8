"""Records of removed checkpoints: which chunks a manifest named when retention or tiering removed it.

They reference nothing (GC never keeps a chunk for them); GC reads them only to say which run the
bytes it frees came from, and drops each record once none of its chunks is left waiting for GC.
A record that does not parse is dropped: it costs attribution, never safety.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from training_platform.checkpoints.layout import removed_key
from training_platform.checkpoints.manifest import CheckpointManifest
from training_platform.checkpoints.storage import Storage

log = logging.getLogger(__name__)

PREFIX = "removed"


def record_removal(storage: Storage, manifest: CheckpointManifest, why: str) -> None:
    """Write the record before the manifest goes, so a crash in between loses no attribution."""
    body = {
        "run_id": manifest.run_id,
        "step": manifest.step,
        "why": why,
        "removed_at": datetime.now(UTC).isoformat(),
        "chunks": sorted(ref.digest for ref in manifest.chunks),
    }
    storage.put(removed_key(manifest.run_id, manifest.step), json.dumps(body).encode(), sync_parent=False)


class Removals:
    """The removal records of one tier: chunk digest -> the run whose removed manifest named it."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self.chunks_by_key: dict[str, set[str]] = {}
        self.run_of: dict[str, str] = {}
        for key in storage.list(PREFIX):
            try:
                body = json.loads(storage.get(key))
                run_id, chunks = str(body["run_id"]), set(body["chunks"])
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable removal record %s/%s: %s", storage.uri, key, exc)
                storage.delete(key)
                continue
            self.chunks_by_key[key] = chunks
            for digest in chunks:
                self.run_of.setdefault(digest, run_id)  # keys are sorted: the same run each time

    def drop_settled(self, waiting: set[str]) -> int:
        """Delete the records none of whose chunks still waits for GC (young or postponed); returns how many."""
        settled = [key for key, chunks in self.chunks_by_key.items() if not chunks & waiting]
        for key in settled:
            self.storage.delete(key)
        return len(settled)
