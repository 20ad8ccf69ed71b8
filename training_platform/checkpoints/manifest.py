"""The checkpoint manifest: written last, it is what makes a checkpoint visible.

A checkpoint is a manifest pointing at content-addressed chunks. A tensor larger than one
chunk is split, so an unchanged slice of it is deduplicated too. The manifest carries its
own sha256 (over its canonical form without that field), so an edited manifest is detected
just like an edited chunk.

Chunks are named by their BLAKE3 hash since format 3: every save hashes the whole state, and
BLAKE3 does it about six times faster than sha256 on one core (both 256-bit). Format 2 named
them by sha256; its manifests still read, verify and restore unchanged.

Since format 4 a chunk may live in a pack (several chunks in one file, packs.py): its reference
names the pack and the offset there. The digest stays the chunk's identity: a reader that does not
find the pack looks for the chunk on its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import blake3
from pydantic import BaseModel, Field, ValidationError, field_validator, model_serializer, model_validator

from training_platform.checkpoints.layout import is_object_name
from training_platform.errors import CheckpointError

FORMAT_VERSION = 4
READABLE_FORMATS = (2, 3, 4)
UNPACKED_FORMAT = 3
"""what a manifest naming no pack is written as, so that builds from before packs read it"""

ChunkHash = Literal["blake3", "sha256"]
CHUNK_HASH: ChunkHash = "blake3"

MAX_CHUNK_BYTES = 1 << 30
MAX_PACK_BYTES = 1 << 40
"""No chunk is larger (the writer cuts 64 MiB pieces): a manifest's sizes are checked against it
when it is parsed, before a reader allocates anything for them."""


def chunk_digest(data: bytes | memoryview, algorithm: ChunkHash = CHUNK_HASH) -> str:
    """The hex digest that names a chunk (both hashes release the GIL on large inputs)."""
    hasher = blake3.blake3 if algorithm == "blake3" else hashlib.sha256
    return hasher(data).hexdigest()


class ChunkRef(BaseModel):
    """Bytes named by their hash: the object ``chunks/<digest>``, or `size` bytes at `offset` in ``packs/<pack>``.

    Stored as ``{"blake3": <hex>, "size": n}`` (plus ``"pack"`` and ``"offset"`` when packed); a
    format-2 reference reads from and writes back to ``{"sha256": <hex>, "size": n}``, so an old
    manifest's own hash still verifies.
    """

    digest: str
    size: int
    algorithm: ChunkHash = CHUNK_HASH
    pack: str | None = None
    offset: int = 0

    @model_validator(mode="before")
    @classmethod
    def _from_stored(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "digest" in data:
            return data
        named = [name for name in get_args(ChunkHash) if name in data]
        if len(named) != 1:
            raise ValueError(f"a chunk reference names exactly one hash of {get_args(ChunkHash)}, got {sorted(data)}")
        rest = {key: value for key, value in data.items() if key != named[0]}
        return {"digest": data[named[0]], "algorithm": named[0], **rest}

    @field_validator("size")
    @classmethod
    def _bounded(cls, size: int) -> int:
        if not 0 <= size <= MAX_CHUNK_BYTES:
            raise ValueError(
                f"chunk size {size} is outside 0..{MAX_CHUNK_BYTES} bytes, which no writer of this store "
                "produces: the manifest is damaged or crafted"
            )
        return size

    @model_validator(mode="after")
    def _valid_location(self) -> ChunkRef:
        if self.pack is not None and not is_object_name(self.pack):
            raise ValueError(f"pack id {self.pack!r} is not 64 hex digits: the manifest is damaged or crafted")
        if not 0 <= self.offset <= MAX_PACK_BYTES:
            raise ValueError(f"chunk offset {self.offset} is outside 0..{MAX_PACK_BYTES}: the manifest is damaged")
        return self

    @model_serializer
    def _to_stored(self) -> dict[str, str | int]:
        stored: dict[str, str | int] = {self.algorithm: self.digest, "size": self.size}
        if self.pack is not None:
            stored |= {"pack": self.pack, "offset": self.offset}
        return stored

    def matches(self, data: bytes | memoryview) -> bool:
        return len(data) == self.size and chunk_digest(data, self.algorithm) == self.digest


def stored_names(refs: Iterable[ChunkRef]) -> set[str]:
    """What GC keeps for these references: each chunk's digest, and the pack it is read from (GC keeps a
    pack that a reference locates a chunk in, and a chunk on its own that a digest names)."""
    return {ref.digest for ref in refs} | {ref.pack for ref in refs if ref.pack is not None}


class TensorRef(BaseModel):
    """A tensor's bytes: `size` bytes from `offset` in the concatenation of its chunks.

    Large tensors own their chunks (offset 0); small ones share a packed chunk.
    """

    dtype: str
    shape: list[int]
    size: int
    offset: int = 0
    chunks: list[ChunkRef]

    @model_validator(mode="after")
    def _within_chunks(self) -> TensorRef:
        # The reader allocates `size` bytes: bound it by chunks that are each bounded.
        if self.size < 0 or self.offset < 0 or self.offset + self.size > sum(c.size for c in self.chunks):
            raise ValueError(
                f"tensor of {self.size} bytes from offset {self.offset} does not lie within its chunks "
                f"({sum(c.size for c in self.chunks)} bytes): the manifest is damaged or crafted"
            )
        return self


class FileRef(BaseModel):
    """A file of a sharded (DCP) or framework (DeepSpeed) checkpoint directory."""

    size: int
    chunks: list[ChunkRef]


class SaveRecord(BaseModel):
    """How the save went: the figures shown per checkpoint in Dagster metadata."""

    bytes_written: int = 0
    bytes_deduplicated: int = 0
    stall_seconds: float = 0.0
    background_seconds: float = 0.0


class CheckpointManifest(BaseModel):
    format_version: int = FORMAT_VERSION
    run_id: str
    step: int
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    kind: Literal["state", "files"] = "state"
    skeleton: ChunkRef | None = None
    tensors: list[TensorRef] = Field(default_factory=list)
    files: dict[str, FileRef] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    save: SaveRecord = Field(default_factory=SaveRecord)
    attributes: dict[str, str | int | float] = Field(default_factory=dict)
    # Where this copy was read from; not part of the content hash.
    uri: str = ""
    tier: str = "hot"
    manifest_sha256: str = ""
    signature: str = ""
    """HMAC of the content hash under the deployment's key (signing.py); empty before signing was"""

    @property
    def chunks(self) -> list[ChunkRef]:
        refs = [self.skeleton] if self.skeleton else []
        refs += [chunk for tensor in self.tensors for chunk in tensor.chunks]
        refs += [chunk for file in self.files.values() for chunk in file.chunks]
        unique: dict[str, ChunkRef] = {}
        for ref in refs:  # a chunk of small tensors is shared by several; a located reference wins
            if ref.digest not in unique or unique[ref.digest].pack is None:
                unique[ref.digest] = ref
        return list(unique.values())

    def with_format(self) -> CheckpointManifest:
        """This manifest at the oldest format that can say what it holds (before it is sealed)."""
        packed = any(ref.pack is not None for ref in self.chunks)
        return self.model_copy(update={"format_version": FORMAT_VERSION if packed else UNPACKED_FORMAT})

    @property
    def total_bytes(self) -> int:
        return sum(chunk.size for chunk in self.chunks)

    def content_hash(self) -> str:
        body = self.model_dump(mode="json", exclude={"manifest_sha256", "signature", "uri", "tier"})
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def summary(self) -> dict:
        """The figures shown in Dagster metadata and the CLI (flat scalars)."""
        return {
            "step": self.step,
            "uri": self.uri,
            "bytes": self.total_bytes,
            "sha256": self.manifest_sha256,
            "created_at": self.created_at,
            "bytes_written": self.save.bytes_written,
            "bytes_deduplicated": self.save.bytes_deduplicated,
            "stall_seconds": round(self.save.stall_seconds, 4),
            "background_seconds": round(self.save.background_seconds, 4),
            "tier": self.tier,
        }


def parse_manifest(raw: bytes | str) -> CheckpointManifest:
    """A stored manifest; ValueError when torn. One of a newer format is refused by name before it
    is validated: a field this build does not know may list chunks, and its shape may not parse."""
    body = json.loads(raw)
    version = body.get("format_version") if isinstance(body, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint format {version} is newer than this build reads "
            f"({', '.join(map(str, READABLE_FORMATS))}); upgrade training_platform"
        )
    try:
        return CheckpointManifest.model_validate(body)
    except ValidationError as exc:  # one line naming each bad field, for the restore's reasons
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise ValueError("; ".join(problems)) from None


def run_checkpoint_summary(manifests: list[CheckpointManifest], training_seconds: float) -> dict:
    """Per-run figures for the `checkpoints` asset: overhead is stall time over training time."""
    stall = sum(m.save.stall_seconds for m in manifests)
    return {
        "checkpoints": len(manifests),
        "bytes_written": sum(m.save.bytes_written for m in manifests),
        "bytes_deduplicated": sum(m.save.bytes_deduplicated for m in manifests),
        "stall_seconds": round(stall, 4),
        "background_seconds": round(sum(m.save.background_seconds for m in manifests), 4),
        "checkpoint_overhead_fraction": round(stall / training_seconds, 6) if training_seconds > 0 else None,
    }
