"""Read one checkpoint's tensors, verifying every chunk's hash, in parallel.

Large tensors are read straight into their final memory (no intermediate copy); packed
small tensors are sliced out of their verified pack.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from training_platform.checkpoints.layout import TRASH, chunk_key, parse_trash_key, quarantine_key
from training_platform.checkpoints.manifest import CheckpointManifest, ChunkRef, TensorRef
from training_platform.checkpoints.serialization import dtype_from_name, tensor_from_bytes
from training_platform.checkpoints.storage import Storage
from training_platform.errors import CheckpointError

READ_WORKERS = max(4, min(16, os.cpu_count() or 4))


class ChunkReader:
    """Fetches chunks from the first tier that has them and checks size and hash.

    A chunk that fails either is moved to quarantine/: dedup would otherwise keep trusting the
    damaged copy, so every later save would reference it; once it is gone, the next save that
    holds those bytes writes it again.
    """

    def __init__(self, tiers: Sequence[Storage]):
        self.tiers = list(tiers)

    def read_into(self, ref: ChunkRef, out: memoryview) -> None:
        key = chunk_key(ref.digest)
        for tier in self.tiers:
            try:
                size = tier.get_into(key, out)
            except FileNotFoundError:
                continue
            except ValueError as exc:  # larger than the manifest says
                raise self._damaged(tier, ref, f"does not match its size: {exc}") from None
            if not ref.matches(out[:size]):
                raise self._damaged(tier, ref, f"does not match its {ref.algorithm} hash (corrupted)")
            return
        if self._read_set_aside(ref, out):
            return
        raise CheckpointError(f"chunk {self.tiers[0].uri}/{key} is missing (looked in {self._where()})")

    def _read_set_aside(self, ref: ChunkRef, out: memoryview) -> bool:
        """Read a chunk a GC has set aside and is about to put back (retention.py), or left there when it died."""
        for tier in self.tiers:
            for key in [k for k in tier.list(TRASH) if parse_trash_key(k)[0] == ref.digest]:
                try:
                    size = tier.get_into(key, out)
                except (FileNotFoundError, ValueError):
                    continue
                if ref.matches(out[:size]):
                    return True
        return False

    def _damaged(self, tier: Storage, ref: ChunkRef, problem: str) -> CheckpointError:
        key = chunk_key(ref.digest)
        target = quarantine_key(ref.digest)
        try:
            tier.move(key, target)
            where = f"; quarantined to {tier.uri}/{target}, so the next save that holds it writes it again"
        except FileNotFoundError:
            where = ""  # someone else moved it first
        except (OSError, CheckpointError) as exc:
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
    """Every tensor of the manifest, verified; raises CheckpointError naming the bad chunk."""
    reader = ChunkReader(tiers)
    packs: dict[str, object] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tp-ckpt-read") as pool:
        owned: list[torch.Tensor | None] = []
        jobs = []
        for ref in manifest.tensors:
            if _owns_chunks(ref):
                flat = torch.empty(ref.size, dtype=torch.uint8)
                view = memoryview(flat.numpy()).cast("B") if ref.size else memoryview(b"")
                position = 0
                for chunk in ref.chunks:
                    jobs.append(pool.submit(reader.read_into, chunk, view[position : position + chunk.size]))
                    position += chunk.size
                owned.append(flat)
            else:
                for chunk in ref.chunks:
                    if chunk.digest not in packs:
                        packs[chunk.digest] = pool.submit(reader.read, chunk)
                owned.append(None)
        for job in jobs:
            job.result()
        pack_data = {digest: future.result() for digest, future in packs.items()}
    tensors = []
    for ref, flat in zip(manifest.tensors, owned, strict=True):
        if flat is None:
            joined = b"".join(pack_data[c.digest] for c in ref.chunks) if len(ref.chunks) > 1 else None
            source = joined if joined is not None else pack_data[ref.chunks[0].digest]
            piece = bytearray(source[ref.offset : ref.offset + ref.size])
            flat = torch.frombuffer(piece, dtype=torch.uint8) if ref.size else torch.empty(0, dtype=torch.uint8)
        tensors.append(tensor_from_bytes(flat, dtype_from_name(ref.dtype), ref.shape))
    return tensors


def _owns_chunks(ref: TensorRef) -> bool:
    return ref.offset == 0 and sum(chunk.size for chunk in ref.chunks) == ref.size
