"""Packs: a save's new chunks appended to a few large files instead of one file each.

Reading many files costs more than reading the same bytes from a few. On this project's virtio disk
(ext4), a 1 GiB state read back from a cold page cache with four threads took 1.28-1.33 s from 64
files of 16 MiB, 1.04 s from 16 files of 64 MiB, and 1.08 s as one file: restores lost a fifth of the
disk's speed to files the size of one 2048x2048 layer.

So a save to a filesystem (a storage with `open_append`) appends each new chunk to a pack of the
thread writing it, and seals the pack (fsync, rename) at PACK_TARGET_BYTES and at the save's end,
then writes the pack's index. A chunk keeps its identity, its digest: the manifest names the pack and
offset it sits at (manifest.ChunkRef), and later saves of any run find it through the indexes and
reuse it. Dedup follows tensors as before; packing changes only where the bytes lie.

GC takes a pack whole, once no manifest or lease names any chunk in it (retention.py), so a pack of
which one chunk is still needed keeps all its bytes. A damaged chunk is dropped from its pack's index
(reader.py): saves stop reusing it, and the next one that holds those bytes writes them again.

Storage without `open_append` (S3) keeps a chunk per object.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading

from training_platform.checkpoints.layout import pack_index_key, pack_key, pack_of_index_key
from training_platform.checkpoints.manifest import ChunkRef
from training_platform.checkpoints.storage import Storage

log = logging.getLogger(__name__)

PACK_TARGET_BYTES = 64 << 20
PACKS = "packs"


def packs_supported(storage: Storage) -> bool:
    """The storage can hold packs: it appends (`open_append`) and reads ranges (`get_range`), as LocalStorage."""
    return hasattr(storage, "open_append")


class _OpenPack:
    def __init__(self, storage: Storage, pack_id: str):
        self.storage = storage
        self.id = pack_id
        self.file = storage.open_append(pack_key(pack_id))  # type: ignore[attr-defined]
        self.entries: list[ChunkRef] = []
        self.sealed = False

    def append(self, ref: ChunkRef, piece: memoryview) -> ChunkRef:
        located = ref.model_copy(update={"pack": self.id, "offset": self.file.size})
        self.file.append(piece)
        self.entries.append(located)
        return located

    def seal(self) -> None:
        """Durable pack first, then its index: an index never names bytes that are not there."""
        self.file.commit()
        self.sealed = True
        _write_index(self.storage, self.id, self.entries, sync_parent=False)


class PackWriter:
    """The packs one save appends to: one per writing thread, so that each file is written in order."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._mine = threading.local()
        self._lock = threading.Lock()
        self._open: list[_OpenPack] = []

    def append(self, ref: ChunkRef, piece: memoryview) -> ChunkRef:
        """Write PIECE (whose reference is REF) to this thread's pack; returns REF located there."""
        pack = getattr(self._mine, "pack", None)
        if pack is None:
            pack = self._mine.pack = _OpenPack(self.storage, secrets.token_hex(32))
            with self._lock:
                self._open.append(pack)
        located = pack.append(ref, piece)
        if pack.file.size >= PACK_TARGET_BYTES:
            self._mine.pack = None
            pack.seal()
        return located

    def close(self) -> None:
        """Seal the packs still open (once no append is in flight); the directory's fsync is the caller's."""
        for pack in self._take_open():
            pack.seal()

    def abort(self) -> None:
        """Drop the packs still open (a failed save): their temporaries go, nothing names them."""
        for pack in self._take_open():
            pack.file.abort()

    def _take_open(self) -> list[_OpenPack]:
        with self._lock:
            packs, self._open = self._open, []
        self._mine = threading.local()
        return [pack for pack in packs if not pack.sealed]


def read_pack_index(storage: Storage, pack_id: str) -> list[ChunkRef]:
    """The chunks a pack's index lists; FileNotFoundError when it has none, ValueError when it does not parse."""
    raw = storage.get(pack_index_key(pack_id))
    try:
        entries = [ChunkRef.model_validate(entry) for entry in json.loads(raw)["chunks"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"pack index {storage.uri}/{pack_index_key(pack_id)} is unreadable: {exc}") from None
    if any(entry.pack != pack_id for entry in entries):
        raise ValueError(f"pack index {storage.uri}/{pack_index_key(pack_id)} names chunks of another pack")
    return entries


_indexes: dict[tuple[str, str], tuple[float, int, list[ChunkRef]]] = {}
_indexes_lock = threading.Lock()


def pack_indexes(storage: Storage) -> dict[str, list[ChunkRef]]:
    """Every pack's index on STORAGE (pack id -> its chunks), skipping unreadable ones.

    An index changes only when a damaged chunk is dropped from it, so one read in this process is kept
    for as long as the index's size and time stay the same: a save lists the indexes, and reads only new ones.
    """
    found: dict[str, list[ChunkRef]] = {}
    listed: set[tuple[str, str]] = set()
    for info in storage.list_info(PACKS):
        pack_id = pack_of_index_key(info.key)
        if pack_id is None:
            continue
        cache_key = (storage.uri, info.key)
        listed.add(cache_key)
        with _indexes_lock:
            cached = _indexes.get(cache_key)
        if cached is not None and cached[:2] == (info.modified, info.size):
            found[pack_id] = cached[2]
            continue
        try:
            entries = read_pack_index(storage, pack_id)
        except FileNotFoundError:
            continue  # collected meanwhile
        except ValueError as exc:
            log.warning("%s: its chunks are not reused", exc)
            continue
        with _indexes_lock:
            _indexes[cache_key] = (info.modified, info.size, entries)
        found[pack_id] = entries
    with _indexes_lock:
        for gone in [key for key in _indexes if key[0] == storage.uri and key not in listed]:
            del _indexes[gone]
    return found


def packed_chunks(storage: Storage) -> dict[str, ChunkRef]:
    """Each chunk the packs on STORAGE hold, by digest, located."""
    return {entry.digest: entry for entries in pack_indexes(storage).values() for entry in entries}


def drop_from_index(storage: Storage, pack_id: str, digest: str) -> None:
    """Stop saves from reusing a damaged chunk of a pack (its other chunks stay named, and kept)."""
    entries = read_pack_index(storage, pack_id)
    kept = [entry for entry in entries if entry.digest != digest]
    if len(kept) != len(entries):
        _write_index(storage, pack_id, kept)


def _write_index(storage: Storage, pack_id: str, entries: list[ChunkRef], *, sync_parent: bool = True) -> None:
    body = {"chunks": [entry.model_dump() for entry in entries]}
    storage.put(pack_index_key(pack_id), json.dumps(body).encode(), sync_parent=sync_parent)
