"""Read one checkpoint's tensors, verifying every chunk's hash, in parallel.

Large tensors are read straight into their final memory (no intermediate copy); small tensors
sharing a chunk are sliced out of it once it is verified.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from training_platform.checkpoints.layout import TRASH, chunk_key, pack_key, parse_trash_key, quarantine_key
from training_platform.checkpoints.manifest import CheckpointManifest, ChunkRef, TensorRef
from training_platform.checkpoints.packs import drop_from_index, packed_chunks, packs_supported
from training_platform.checkpoints.serialization import dtype_from_name, tensor_from_bytes
from training_platform.checkpoints.storage import Storage
from training_platform.errors import CheckpointError

READ_WORKERS = max(4, min(16, os.cpu_count() or 4))


class ChunkReader:
    """Fetches chunks from the first tier that has them and checks size and hash.

    A packed chunk is read from its pack, or on its own when the pack is gone (a save that found the
    pack collected rewrote it alone: writer.recheck_reused; tiering copies chunks alone).

    A chunk that fails either is moved to quarantine/: dedup would otherwise keep trusting the
    damaged copy, so every later save would reference it; once it is gone, the next save that
    holds those bytes writes it again. Of a pack, the damaged bytes are copied there, and the chunk
    is dropped from the pack's index, which is what saves reuse from.
    """

    def __init__(self, tiers: Sequence[Storage]):
        self.tiers = list(tiers)

    def read_into(self, ref: ChunkRef, out: memoryview) -> None:
        damage: CheckpointError | None = None  # the first copy found damaged, raised if no good one is
        for tier in self.tiers:
            for packed in (True, False) if ref.pack is not None and packs_supported(tier) else (False,):
                try:
                    if packed:
                        tier.get_range(pack_key(ref.pack), ref.offset, out[: ref.size])
                        size = ref.size
                    else:
                        size = tier.get_into(chunk_key(ref.digest), out)
                except FileNotFoundError:
                    continue
                except ValueError as exc:  # larger than the manifest says, or a pack that ends too soon
                    damage = damage or self._damaged(tier, ref, packed, None, f"does not match its size: {exc}")
                    continue
                if not ref.matches(out[:size]):
                    problem = f"does not match its {ref.algorithm} hash (corrupted)"
                    damage = damage or self._damaged(tier, ref, packed, out[:size], problem)
                    continue
                return
        if self._read_repacked(ref, out) or self._read_set_aside(ref, out):
            return
        raise damage or CheckpointError(
            f"chunk {self.tiers[0].uri}/{chunk_key(ref.digest)} is missing (looked in {self._where()})"
        )

    def _read_repacked(self, ref: ChunkRef, out: memoryview) -> bool:
        """Read the chunk from another pack: a later save that held the same bytes wrote them again there,
        after the copy this reference names was damaged or lost."""
        for tier in self.tiers:
            if not packs_supported(tier):
                continue
            copy = packed_chunks(tier).get(ref.digest)
            if copy is None or copy.pack == ref.pack:
                continue
            try:
                tier.get_range(pack_key(copy.pack), copy.offset, out[: ref.size])
            except (FileNotFoundError, ValueError):
                continue
            if ref.matches(out[: ref.size]):
                return True
        return False

    def _read_set_aside(self, ref: ChunkRef, out: memoryview) -> bool:
        """Read a chunk (or its pack) a GC has set aside and is about to put back (retention.py), or left there
        when it died."""
        for tier in self.tiers:
            for key in tier.list(TRASH):
                name = parse_trash_key(key)[0]
                try:
                    if name == ref.digest:
                        size = tier.get_into(key, out)
                    elif ref.pack is not None and name == ref.pack and packs_supported(tier):
                        tier.get_range(key, ref.offset, out[: ref.size])
                        size = ref.size
                    else:
                        continue
                except (FileNotFoundError, ValueError):
                    continue
                if ref.matches(out[:size]):
                    return True
        return False

    def _damaged(
        self, tier: Storage, ref: ChunkRef, packed: bool, data: memoryview | None, problem: str
    ) -> CheckpointError:
        """PACKED: read from its pack; DATA: the damaged bytes read (None when none could be)."""
        target = quarantine_key(ref.digest)
        key = f"{pack_key(ref.pack)} at byte {ref.offset}" if packed and ref.pack else chunk_key(ref.digest)
        try:
            if packed and ref.pack:
                if data is not None:
                    tier.put(target, data)
                drop_from_index(tier, ref.pack, ref.digest)
                copied = f"copied to {tier.uri}/{target} and " if data is not None else ""
                where = f"; {copied}dropped from its pack's index, so the next save that holds it writes it again"
            else:
                tier.move(key, target)
                where = f"; quarantined to {tier.uri}/{target}, so the next save that holds it writes it again"
        except FileNotFoundError:
            where = ""  # someone else moved it first
        except (OSError, ValueError, CheckpointError) as exc:
            where = f"; it could not be quarantined ({exc}): delete it so that the next save writes it again"
        return CheckpointError(f"chunk {tier.uri}/{key} {problem}{where}")

    def read(self, ref: ChunkRef) -> memoryview:
        buffer = memoryview(bytearray(ref.size)) if ref.size else memoryview(bytearray(1))[:0]
        self.read_into(ref, buffer)
        return buffer

    def _where(self) -> str:
        return ", ".join(tier.uri for tier in self.tiers)


def read_tensors(
    tiers: Sequence[Storage], manifest: CheckpointManifest, workers: int = READ_WORKERS
) -> list[torch.Tensor]:
    """Every tensor of the manifest, verified; raises CheckpointError naming the bad chunk.

    A pack's chunks are read by one thread in the pack's order, packs in parallel: one stream per file
    is what the disk reads fastest (packs.py).
    """
    reader = ChunkReader(tiers)
    located = {ref.digest: ref for ref in manifest.chunks}  # a duplicate within a save may name no pack
    reads: list[tuple[ChunkRef, memoryview]] = []
    shared: dict[str, memoryview] = {}  # chunks of several small tensors: read whole, sliced below
    owned: list[torch.Tensor | None] = []
    for ref in manifest.tensors:
        if _owns_chunks(ref):
            flat = torch.empty(ref.size, dtype=torch.uint8)
            view = memoryview(flat.numpy()).cast("B") if ref.size else memoryview(b"")
            position = 0
            for chunk in ref.chunks:
                reads.append((located[chunk.digest], view[position : position + chunk.size]))
                position += chunk.size
            owned.append(flat)
        else:
            for chunk in ref.chunks:
                if chunk.digest not in shared:
                    shared[chunk.digest] = memoryview(bytearray(chunk.size))
                    reads.append((located[chunk.digest], shared[chunk.digest]))
            owned.append(None)
    by_file: dict[str, list[tuple[ChunkRef, memoryview]]] = {}
    for chunk, out in reads:
        by_file.setdefault(chunk.pack or chunk.digest, []).append((chunk, out))

    def read_file(chunks: list[tuple[ChunkRef, memoryview]]) -> None:
        for chunk, out in sorted(chunks, key=lambda item: item[0].offset):
            reader.read_into(chunk, out)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tp-ckpt-read") as pool:
        # Largest first, so that the last file read is not a long one.
        ordered = sorted(by_file.values(), key=lambda chunks: -sum(chunk.size for chunk, _ in chunks))
        for job in [pool.submit(read_file, chunks) for chunks in ordered]:
            job.result()
    tensors = []
    for ref, flat in zip(manifest.tensors, owned, strict=True):
        if flat is None:
            joined = b"".join(shared[c.digest] for c in ref.chunks) if len(ref.chunks) > 1 else None
            source = joined if joined is not None else shared[ref.chunks[0].digest]
            piece = bytearray(source[ref.offset : ref.offset + ref.size])
            flat = torch.frombuffer(piece, dtype=torch.uint8) if ref.size else torch.empty(0, dtype=torch.uint8)
        tensors.append(tensor_from_bytes(flat, dtype_from_name(ref.dtype), ref.shape))
    return tensors


def _owns_chunks(ref: TensorRef) -> bool:
    return ref.offset == 0 and sum(chunk.size for chunk in ref.chunks) == ref.size
