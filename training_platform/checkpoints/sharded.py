"""Sharded checkpoints with torch.distributed.checkpoint (DCP) for DDP/FSDP state dicts.

Every rank lets DCP write its own shard files, which go straight into content-addressed chunks
of the store as DCP writes them (dcp_chunks.py; in parallel on every rank). Rank 0 writes the
manifest, listing every rank's files, only after all ranks' chunks are durable. Restore lets DCP
read the files from their chunks, each fetched and verified as DCP comes to it, which reshards:
a checkpoint written by N ranks loads on M ranks, or in one process without a process group,
wherever DCP allows it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from training_platform.checkpoints.dcp_chunks import ChunkedFiles, StoredFiles
from training_platform.checkpoints.dcp_safe import SafeFileSystemReader, SafeLoadPlanner
from training_platform.checkpoints.manifest import CheckpointManifest, SaveRecord, stored_names
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.reader import ChunkReader
from training_platform.checkpoints.serialization import flatten_state, tensor_blob
from training_platform.checkpoints.store import CheckpointStore, RunCheckpoints, nothing_restores
from training_platform.checkpoints.writer import (
    ChunkSink,
    SaveStats,
    WrittenChunks,
    protect_reused,
    publish,
    settle_seconds,
    write_chunks,
)
from training_platform.errors import CheckpointError

DCP_FORMAT = "torch.distributed.checkpoint"


def _distributed(group) -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank(group) -> int:
    return dist.get_rank(group) if _distributed(group) else 0


def _gather(obj: Any, group) -> list[Any]:
    if not _distributed(group):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def save_sharded(
    store: CheckpointStore,
    run_id: str,
    step: int,
    state_dict: dict[str, Any],
    metrics: dict[str, float] | None = None,
    *,
    weights: dict[str, Any] | None = None,
    process_group=None,
    stall_seconds: float | None = None,
    pacer: Pacer | None = None,
) -> CheckpointManifest:
    """Collective: every rank calls it; returns the manifest (on every rank).

    `stall_seconds`: what a save written in the background cost the loop (its copy of the state); None when the
    loop waits for this call, which is then all stall. `pacer`: the pace of this rank's chunks (pacing.py).

    `weights` (rank 0's, when given): the full model weights, stored beside the shards as tensors
    that `CheckpointStore.load` reads (`{"model": weights}`).
    """
    started = time.monotonic()
    rank = _rank(process_group)
    skeleton, blobs = None, []
    if weights is not None and rank == 0:
        skeleton, tensors = flatten_state({"model": weights})
        blobs = [tensor_blob(tensor) for tensor in tensors]
    stats, pacer = SaveStats(), pacer or Pacer()
    pacer.plan(_local_bytes(state_dict) + sum(blob.data.nbytes for blob in blobs))
    files = ChunkedFiles(ChunkSink(store.storage, stats, pacer))
    try:
        # A failure here (the store's, while DCP writes) is DCP's to tell every rank: dcp.save raises on all.
        dcp.save(state_dict, storage_writer=files.writer(), process_group=process_group)
    except BaseException as exc:
        files.close()
        files.sink.abort()
        if isinstance(exc, dcp.CheckpointException):
            raise CheckpointError(f"checkpoint step {step} was not written: {_first_failure(exc)}") from exc
        raise
    files.close()
    try:
        files.sink.close()  # seals the packs the DCP files' chunks went to
        # Rank 0's weights, and (on every rank) the sync that makes the DCP files' chunks durable too.
        written = write_chunks(store.storage, skeleton=skeleton, blobs=blobs, pacer=pacer, stats=stats)
        refs = [ref for file in files.files.values() for ref in file.chunks]
        refs += [ref for tensor in written.tensors for ref in tensor.chunks]
        refs += [written.skeleton] if written.skeleton else []
        lease = protect_reused(store.storage, run_id, step, stored_names(refs), stats, store.lease_settle_seconds)
        # Waiting, not work: the lease's settle and the pace (`every_steps: auto` reads the save's cost).
        waited = pacer.idle_seconds + (settle_seconds(store.lease_settle_seconds) if lease else 0.0)
        part = {
            "files": {name: ref.model_dump() for name, ref in files.files.items()},
            "written": stats.bytes_written,
            "deduplicated": stats.bytes_deduplicated,
            "lease": lease,
        }
    except (CheckpointError, OSError) as exc:  # told to every rank: none waits for a part that will not come
        part = {"error": f"rank {rank}: {exc}"}
    parts = _gather(part, process_group)
    if failed := [p["error"] for p in parts if "error" in p]:
        raise CheckpointError(f"checkpoint step {step} was not written: {failed[0]}")
    outcome: CheckpointManifest | str | None = None
    if rank == 0:
        try:
            outcome = _publish_parts(store, run_id, step, parts, written, metrics, started, stall_seconds, waited)
        except (CheckpointError, OSError) as exc:  # told to every rank, which waits for the outcome
            outcome = f"rank 0: {exc}"
    # No rank returns before the checkpoint is visible: the caller may prune or exit next.
    outcome = _broadcast(outcome, process_group)
    if isinstance(outcome, str):
        raise CheckpointError(f"checkpoint step {step} was not written: {outcome}")
    return outcome


def _local_bytes(state: Any) -> int:
    """The bytes of this rank's part of the state's tensors (a DTensor's local shard): what DCP writes here."""
    if isinstance(state, DTensor):
        return _local_bytes(state.to_local())
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_local_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(_local_bytes(value) for value in state)
    return 0


def _publish_parts(
    store: CheckpointStore,
    run_id: str,
    step: int,
    parts: list[dict[str, Any]],
    written: WrittenChunks,
    metrics: dict[str, float] | None,
    started: float,
    stall_seconds: float | None,
    waited: float,
) -> CheckpointManifest:
    """Rank 0: the manifest listing every rank's files (and rank 0's weights), written last. `waited`: seconds of
    the save that were no work (its pace, its lease's settle), left out of a background save's cost."""
    merged = {}
    for part in parts:
        for name, ref in part["files"].items():
            if name in merged and merged[name] != ref:
                raise CheckpointError(f"two ranks wrote different contents for DCP file {name}")
            merged[name] = ref
    elapsed = time.monotonic() - started
    manifest = publish(
        store.storage,
        CheckpointManifest(
            run_id=run_id,
            step=step,
            kind="files",
            files=merged,
            skeleton=written.skeleton,
            tensors=written.tensors,
            metrics=metrics or {},
            attributes={"format": DCP_FORMAT, "world_size": len(parts)},
            save=SaveRecord(
                bytes_written=sum(p["written"] for p in parts),
                bytes_deduplicated=sum(p["deduplicated"] for p in parts),
                stall_seconds=elapsed if stall_seconds is None else stall_seconds,
                background_seconds=0.0 if stall_seconds is None else max(0.0, elapsed - waited),
            ),
        ),
        store.signer,
        [p["lease"] for p in parts],
    )
    return store.located(manifest, "hot")


def list_on_main(store: CheckpointStore, run_id: str, *, process_group=None) -> RunCheckpoints:
    """Collective: the run's checkpoints (`CheckpointStore.scan`), read once on rank 0 and sent
    to every rank.

    A failure there (a storage error, a checkpoint of a newer format) is raised on every rank, so
    no rank waits for a list that will not come.
    """
    if _rank(process_group) == 0:
        try:
            checkpoints = store.scan(run_id)
        except (CheckpointError, OSError) as exc:
            _broadcast(str(exc), process_group)
            raise
        return _broadcast(checkpoints, process_group)
    listed = _broadcast(None, process_group)
    if isinstance(listed, str):
        raise CheckpointError(f"rank 0 could not list the checkpoints of run {run_id}: {listed}")
    return listed


def _broadcast(obj: Any, group) -> Any:
    if not _distributed(group):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def load_sharded(
    store: CheckpointStore,
    manifest: CheckpointManifest,
    state_dict: dict[str, Any],
    *,
    process_group=None,
) -> None:
    """Collective: load `manifest` into `state_dict` in place, resharding to this group's layout. Every rank
    reads, and verifies, only the chunks that hold its part (dcp_chunks.StoredFiles)."""
    files = StoredFiles(ChunkReader(store.tiers_for(manifest)), manifest.files)
    reader = files.storage_reader(SafeFileSystemReader)
    try:
        error = None
        try:
            store.check_manifest(manifest)
            reader.read_metadata()  # refused here, alike on every rank, before DCP's collectives
        except (CheckpointError, OSError) as exc:
            error = str(exc)
        errors = [e for e in _gather(error, process_group) if e]
        if errors:  # every rank agrees, so all of them fall back together
            raise CheckpointError(errors[0])
        try:
            dcp.load(state_dict, storage_reader=reader, planner=SafeLoadPlanner(), process_group=process_group)
        except dcp.CheckpointException as exc:  # raised on every rank, with each rank's failure
            raise CheckpointError(f"checkpoint {manifest.uri} does not load: {_first_failure(exc)}") from None
    finally:
        files.close()


def _first_failure(exc: dcp.CheckpointException) -> str:
    """The first rank's failure, ours (a CheckpointError, which names its problem) before any other."""
    failures = [(rank, failure) for rank, (failure, _) in sorted(exc.failures.items())]
    ours = [(rank, failure) for rank, failure in failures if isinstance(failure, CheckpointError)]
    rank, first = (ours or failures)[0]
    return f"rank {rank}: {first}" if ours else f"rank {rank}: {type(first).__name__}: {first}"


def restore_latest_sharded(
    store: CheckpointStore,
    run_id: str,
    state_dict: dict[str, Any],
    *,
    process_group=None,
    checkpoints: RunCheckpoints | None = None,
) -> tuple[CheckpointManifest, list[tuple[int, str]]] | None:
    """Collective: load the newest sharded checkpoint that verifies; returns it and the skipped ones.

    None when the run has no checkpoint; CheckpointError on every rank when it has some and none
    restores. `checkpoints`: the run's, when the caller has already listed them with `list_on_main`.
    """
    if checkpoints is None:
        checkpoints = list_on_main(store, run_id, process_group=process_group)
    skipped = list(checkpoints.unreadable.items())
    for manifest in reversed(checkpoints.manifests):
        if manifest.attributes.get("format") != DCP_FORMAT:
            skipped.append((manifest.step, f"written by another strategy ({written_as(manifest)}), not as DCP shards"))
            continue
        try:
            store.check_manifest(manifest)
            load_sharded(store, manifest, state_dict, process_group=process_group)
        except CheckpointError as exc:
            skipped.append((manifest.step, str(exc)))
            continue
        return manifest, sorted(skipped, reverse=True)
    if skipped:
        raise nothing_restores(run_id, store.uri, sorted(skipped, reverse=True))
    return None


def written_as(manifest: CheckpointManifest) -> str:
    """How a checkpoint was written, for messages: 'state', or its files' format."""
    return manifest.kind if manifest.kind == "state" else str(manifest.attributes.get("format", "files"))
