"""Read one checkpoint's tensors, verifying every chunk's hash, in parallel.

Large tensors are read straight into their final memory (no intermediate copy): the caller's own tensor where it
passes one of the same dtype and shape (a resume's model and optimizer, which the restore overwrites anyway: no
allocation, no page faults, no second copy), new memory otherwise. Small tensors sharing a chunk are sliced out of
it once it is verified.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from training_platform.checkpoints.layout import TRASH, chunk_key, pack_key, parse_trash_key, quarantine_key
from training_platform.checkpoints.manifest import CheckpointManifest, ChunkRef, TensorRef
from training_platform.checkpoints.packs import drop_from_index, packed_chunks, packs_supported
from training_platform.checkpoints.serialization import dtype_from_name, dtype_name, tensor_from_bytes
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
    tiers: Sequence[Storage],
    manifest: CheckpointManifest,
    workers: int = READ_WORKERS,
    into: Mapping[int, torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Every tensor of the manifest, verified; raises CheckpointError naming the bad chunk.

    INTO: tensors to read into, by their index in the manifest; one that does not fit (another dtype or shape,
    not contiguous on the CPU, memory another destination already takes) is left alone. A read that fails
    leaves the ones that fit holding partial bytes: the caller restores into them again or fails.

    A pack's chunks are read by one thread in the pack's order, packs in parallel: one stream per file
    is what the disk reads fastest (packs.py).
    """
    reader = ChunkReader(tiers)
    destinations = _Destinations()
    located = {ref.digest: ref for ref in manifest.chunks}  # a duplicate within a save may name no pack
    reads: list[tuple[ChunkRef, memoryview]] = []
    shared: dict[str, memoryview] = {}  # chunks of several small tensors: read whole, sliced below
    owned: list[torch.Tensor | None] = []  # each tensor's memory; None: a new copy of its bytes in a shared chunk
    for index, ref in enumerate(manifest.tensors):
        given = destinations.take(ref, (into or {}).get(index))
        if _owns_chunks(ref):
            flat = given if given is not None else torch.empty(ref.size, dtype=torch.uint8)
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
            owned.append(given)
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
        if not _owns_chunks(ref):
            joined = b"".join(shared[c.digest] for c in ref.chunks) if len(ref.chunks) > 1 else None
            source = joined if joined is not None else shared[ref.chunks[0].digest]
            piece = bytearray(source[ref.offset : ref.offset + ref.size])
            loaded = torch.frombuffer(piece, dtype=torch.uint8) if ref.size else torch.empty(0, dtype=torch.uint8)
            if flat is None:
                flat = loaded
            else:  # a small tensor of the caller's: its bytes copied in (they were read into the shared chunk)
                flat.copy_(loaded)
        tensors.append(tensor_from_bytes(flat, dtype_from_name(ref.dtype), ref.shape))
    return tensors


def _owns_chunks(ref: TensorRef) -> bool:
    return ref.offset == 0 and sum(chunk.size for chunk in ref.chunks) == ref.size


class _Destinations:
    """The caller's tensors that a restore reads into: each must match its saved tensor and own its memory alone
    (tied weights name one storage twice; a second read into it would race the first one's hash check)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def take(self, ref: TensorRef, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """TENSOR's bytes as a flat uint8 tensor sharing its memory, or None when it cannot take REF's bytes."""
        if (
            tensor is None
            or ref.size == 0
            or tensor.device.type != "cpu"
            or dtype_name(tensor.dtype) != ref.dtype
            or list(tensor.shape) != ref.shape
            or tensor.numel() * tensor.element_size() != ref.size
            or not tensor.is_contiguous()
        ):
            return None
        start = tensor.data_ptr()
        end = start + ref.size
        at = bisect.bisect_left(self._starts, start)
        if (at < len(self._starts) and self._starts[at] < end) or (at > 0 and self._ends[at - 1] > start):
            return None
        self._starts.insert(at, start)
        self._ends.insert(at, end)
        return tensor.detach().reshape(-1).view(torch.uint8)
