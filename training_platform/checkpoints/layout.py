"""Where things live under a store root; every key is validated before use.

chunks/<digest>                          content-addressed bytes (shared by all runs)
packs/<pack id>                          several chunks in one file, as one save wrote them (packs.py)
packs/<pack id>.json                     that pack's index: each chunk's digest, size and offset
runs/<run_id>/<step:012d>.json           manifests, written last
pins/<run_id>/<step:012d>/<reason>.json  references that retention must keep
removed/<run_id>/<step:012d>.json        chunk lists of manifests retention or tiering removed, so GC
                                         can say which run the bytes it frees came from (no reference)
leases/<id>.json                         saves in progress: chunks GC must not delete
quarantine/<digest>.<id>                 chunks that failed their hash on read, kept for inspection
trash/<name>.<time>-<gc id>              chunks and packs a GC set aside: deleted, or put back when a lease or manifest
                                         read after the move names them (retention.py)
clock/<id>.probe                         written and deleted by GC to read the storage's clock
tiers/cold.json                          the cold tier's URI, so every reader of the store finds it
retention/<run_id>.json                  the run's retention policy, applied again when a pin goes
"""

from __future__ import annotations

import hashlib
import uuid

from training_platform.checkpoints.storage import validate_key


def chunk_key(digest: str) -> str:
    if not is_object_name(digest):
        raise ValueError(f"invalid chunk digest {digest!r}")
    return f"chunks/{digest}"


def pack_key(pack_id: str) -> str:
    if not is_object_name(pack_id):
        raise ValueError(f"invalid pack id {pack_id!r}")
    return f"packs/{pack_id}"


def pack_index_key(pack_id: str) -> str:
    return f"{pack_key(pack_id)}.json"


def pack_of_index_key(key: str) -> str | None:
    """The pack an index key names (None for another key under packs/)."""
    name = key.rsplit("/", 1)[-1]
    stem = name.removesuffix(".json")
    return stem if name.endswith(".json") and is_object_name(stem) else None


def is_object_name(name: str) -> bool:
    """A chunk digest or a pack id: 64 lowercase hex digits."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def quarantine_key(digest: str) -> str:
    # A suffix of its own: the same chunk may be damaged again after it was written anew.
    return f"quarantine/{chunk_key(digest).removeprefix('chunks/')}.{uuid.uuid4().hex[:12]}"


TRASH = "trash"


def trash_key(digest: str, set_aside_at: float, gc_id: str) -> str:
    # Flat, so nothing is left behind per deleted chunk; the time is in the name because a move keeps
    # a file's modification time, so the object's own says nothing of when it was set aside.
    return validate_key(f"{TRASH}/{chunk_key(digest).removeprefix('chunks/')}.{int(set_aside_at)}-{gc_id}")


def parse_trash_key(key: str) -> tuple[str, float | None]:
    """The chunk digest under a trash key, and when a GC set it aside (None for a name of another form)."""
    digest, _, rest = key.rsplit("/", 1)[-1].partition(".")
    stamp = rest.split("-", 1)[0]
    return digest, float(stamp) if stamp.isdigit() else None


def run_prefix(run_id: str) -> str:
    return validate_key(f"runs/{run_id}")


def manifest_key(run_id: str, step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return validate_key(f"runs/{run_id}/{step:012d}.json")


def step_of_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def pin_prefix(run_id: str) -> str:
    return validate_key(f"pins/{run_id}")


def pin_key(run_id: str, step: int, reason: str) -> str:
    # A reason is free text ("model churn-classifier v3"); its key is a digest, the text is in the body.
    digest = hashlib.sha256(reason.encode()).hexdigest()[:16]
    return validate_key(f"pins/{run_id}/{step:012d}/{digest}.json")


def removed_key(run_id: str, step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return validate_key(f"removed/{run_id}/{step:012d}.json")


COLD_TIER_KEY = "tiers/cold.json"


def retention_key(run_id: str) -> str:
    return validate_key(f"retention/{run_id}.json")


def clock_probe_key() -> str:
    return f"clock/{uuid.uuid4().hex}.probe"


def lease_key(lease_id: str) -> str:
    return validate_key(f"leases/{lease_id}.json")
