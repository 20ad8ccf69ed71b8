"""CheckpointStore: atomic, verified, deduplicated checkpoints on a storage tier (plus a cold one).

Layout under the store root: see layout.py. Save order: every chunk (skipped when already
present at its size), then the signed manifest (signing.py). A crash at any point leaves either
the previous checkpoint or the new one visible, never a torn one. Restore verifies the manifest's
own hash, its signature and every chunk's hash, and falls back to older checkpoints, saying which
it skipped and why; a run that has checkpoints of which none restores fails instead of starting
over.

The tensor modules are imported where tensors are read or written: the background writer
process applies retention through this class and starts without importing torch.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training_platform.checkpoints.backends import open_storage
from training_platform.checkpoints.layout import (
    COLD_TIER_KEY,
    chunk_key,
    manifest_key,
    pack_key,
    pin_key,
    pin_prefix,
    retention_key,
    run_prefix,
    step_of_manifest_key,
)
from training_platform.checkpoints.manifest import READABLE_FORMATS, CheckpointManifest, ChunkRef, parse_manifest
from training_platform.checkpoints.pacing import Pacer
from training_platform.checkpoints.removed import record_removal
from training_platform.checkpoints.retention import (
    GcReport,
    RetentionPolicy,
    by_save_time,
    collect_garbage,
    steps_to_keep,
)
from training_platform.checkpoints.signing import ManifestSigner, deployment_signer
from training_platform.checkpoints.storage import Storage, validate_key
from training_platform.checkpoints.writer import LEASE_SETTLE_SECONDS, SaveStats, write_checkpoint
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)

# Stats are round trips on S3 (a HEAD each): a few in flight hide the latency.
STAT_WORKERS = 8

__all__ = ["CheckpointStore", "Restored", "RunCheckpoints", "SaveStats", "nothing_restores", "open_store"]


@dataclass
class Restored:
    manifest: CheckpointManifest
    state: Any
    skipped: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RunCheckpoints:
    manifests: list[CheckpointManifest]
    """those that parse, oldest step first"""
    unreadable: dict[int, str]
    """step -> why its manifest does not parse (torn or edited)"""


@dataclass(frozen=True)
class Pin:
    run_id: str
    step: int
    reason: str
    created_at: str


class CheckpointStore:
    """Checkpoints of many runs on a hot tier, optionally with older ones tiered to a cold one."""

    def __init__(
        self,
        storage: Storage,
        cold: Storage | None = None,
        *,
        signer: ManifestSigner | None = None,
        lease_settle_seconds: float = LEASE_SETTLE_SECONDS,
    ):
        self.storage = storage
        self.cold = cold
        self.uri = storage.uri
        self.signer = signer or deployment_signer()
        self.lease_settle_seconds = lease_settle_seconds
        self._policies: dict[str, RetentionPolicy] = {}

    # ----- writing -------------------------------------------------------------------------
    def save(
        self,
        run_id: str,
        step: int,
        state: Any,
        metrics: dict[str, float] | None = None,
        *,
        stall_seconds: float | None = None,
    ) -> tuple[CheckpointManifest, SaveStats]:
        """Write a checkpoint synchronously; returns (manifest, stats).

        `stall_seconds`: what the save cost the caller's loop, for the save's record; None (a caller that waits for
        it): the save's own time, measured.
        """
        from training_platform.checkpoints.serialization import flatten_state, tensor_blob

        skeleton, tensors = flatten_state(state)
        manifest, stats = write_checkpoint(
            self.storage,
            run_id,
            step,
            signer=self.signer,
            skeleton=skeleton,
            blobs=[tensor_blob(t) for t in tensors],
            metrics=metrics,
            stall_seconds=stall_seconds,
            lease_settle_seconds=self.lease_settle_seconds,
        )
        return self.located(manifest, "hot"), stats

    def save_files(
        self,
        run_id: str,
        step: int,
        files: dict[str, Path],
        metrics: dict[str, float] | None = None,
        attributes: dict[str, str | int | float] | None = None,
        *,
        weights: dict[str, Any] | None = None,
        stall_seconds: float = 0.0,
        pacer: Pacer | None = None,
    ) -> tuple[CheckpointManifest, SaveStats]:
        """Checkpoint a directory's files (DCP shards, DeepSpeed output) as chunks; manifest last.

        `weights`: the full model weights, stored beside the files as tensors that `load` reads
        (`{"model": weights}`), for readers that must not parse the framework's files.
        `stall_seconds`: what writing the files cost the training loop, for the save's record.
        `pacer`: the pace of a save in the background (pacing.py).
        """
        from training_platform.checkpoints.serialization import flatten_state, tensor_blob

        for name in files:
            validate_key(name)
        skeleton, tensors = flatten_state({"model": weights}) if weights is not None else (None, [])
        manifest, stats = write_checkpoint(
            self.storage,
            run_id,
            step,
            signer=self.signer,
            skeleton=skeleton,
            blobs=[tensor_blob(t) for t in tensors],
            files=files,
            metrics=metrics,
            attributes=attributes,
            lease_settle_seconds=self.lease_settle_seconds,
            stall_seconds=stall_seconds,
            pacer=pacer,
        )
        return self.located(manifest, "hot"), stats

    # ----- reading -------------------------------------------------------------------------
    def list(self, run_id: str) -> list[CheckpointManifest]:
        """Manifests of the run that parse, oldest first, from every tier (not yet hash-verified).

        Raises CheckpointError when the run has a checkpoint of a newer format than this build's.
        """
        return self.scan(run_id).manifests

    def find(self, run_id: str, step: int, manifest_sha256: str) -> CheckpointManifest:
        """The exact checkpoint a lineage records (step and manifest hash), never 'the newest one on disk'."""
        for manifest in self.list(run_id):
            if manifest.step == step and manifest.manifest_sha256 == manifest_sha256:
                return manifest
        raise CheckpointError(
            f"checkpoint step {step} (sha256 {manifest_sha256[:12]}) of run {run_id} is not in {self.uri}; "
            "it may have been deleted by retention: re-run the training_run partition"
        )

    def scan(self, run_id: str) -> RunCheckpoints:
        """The run's manifests that parse, and why the others do not (see `list`)."""
        found: dict[int, CheckpointManifest] = {}
        unreadable: dict[int, str] = {}
        newer: dict[int, str] = {}
        for tier_name, tier in self._tiers_coldest_first():
            for key in tier.list(run_prefix(run_id)):
                step = step_of_manifest_key(key)
                if step is None:
                    continue
                try:
                    manifest = parse_manifest(tier.get(key))
                except CheckpointError as exc:  # a newer format
                    newer[step] = str(exc)
                    continue
                except (ValueError, OSError) as exc:
                    reason = f"manifest {tier.uri}/{key} is unreadable (torn or edited): {str(exc).splitlines()[0]}"
                    log.warning("ignoring checkpoint: %s", reason)
                    unreadable[step] = reason
                    continue
                if (manifest.run_id, manifest.step) != (run_id, step):  # its signature does not cover where it lies
                    unreadable[step] = (
                        f"manifest {tier.uri}/{key} says it is step {manifest.step} of run {manifest.run_id}: "
                        "a manifest copied or moved from elsewhere is not restored"
                    )
                    continue
                found[manifest.step] = manifest.model_copy(update={"uri": f"{tier.uri}/{key}", "tier": tier_name})
                unreadable.pop(manifest.step, None)
        if newer:
            # Resuming from an older checkpoint would save over the newer ones: leave the run alone.
            step = max(newer)
            raise CheckpointError(f"run {run_id} has a checkpoint this build cannot read at step {step}: {newer[step]}")
        return RunCheckpoints([found[step] for step in sorted(found)], unreadable)

    def run_ids(self) -> list[str]:
        """Every run with at least one manifest on any tier."""
        runs = set()
        for _, tier in self._tiers_coldest_first():
            runs.update(key.split("/")[1] for key in tier.list("runs") if key.count("/") >= 2)
        return sorted(runs)

    def load(self, manifest: CheckpointManifest, into: Any = None) -> Any:
        """Load and verify one checkpoint's state (of a files checkpoint: the weights stored beside its
        files); raises CheckpointError naming the bad file.

        INTO: a state shaped like the saved one (a resume's model and optimizer state dicts): a tensor of the same
        path, dtype and shape is read into in place, and the state returned holds it. The rest is new memory.
        """
        self.check_manifest(manifest)
        if manifest.skeleton is None and manifest.kind == "files":
            raise CheckpointError(
                f"checkpoint {manifest.uri} holds only files ({manifest.attributes.get('format', 'files')}); "
                "restore it with restore_files or training_platform.checkpoints.sharded.load_sharded"
            )
        from training_platform.checkpoints.reader import ChunkReader, read_tensors
        from training_platform.checkpoints.serialization import read_skeleton, tensors_at_same_paths, unflatten_state

        tiers = self.tiers_for(manifest)
        skeleton = ChunkReader(tiers).read(manifest.skeleton) if manifest.skeleton else None
        if skeleton is None:
            raise CheckpointError(f"checkpoint {manifest.uri} has no state skeleton")
        tree = read_skeleton(bytes(skeleton))  # once: it places both the destinations and the tensors read
        destinations = tensors_at_same_paths(tree, into) if into is not None else None
        return unflatten_state(tree, read_tensors(tiers, manifest, into=destinations))

    def restore_files(self, manifest: CheckpointManifest, dest: Path) -> dict[str, Path]:
        """Write a files checkpoint into `dest`, verifying every chunk; returns name -> path."""
        from training_platform.checkpoints.reader import ChunkReader

        self.check_manifest(manifest)
        reader = ChunkReader(self.tiers_for(manifest))
        paths = {}
        for name, ref in manifest.files.items():
            path = Path(dest) / validate_key(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as handle:
                for chunk in ref.chunks:
                    handle.write(reader.read(chunk))
            paths[name] = path
        return paths

    def restore_latest(self, run_id: str, into: Any = None) -> Restored | None:
        """The newest checkpoint whose hashes verify; older ones are tried in turn. INTO: see `load`.

        None when the run has no checkpoint; raises CheckpointError (see `nothing_restores`) when
        it has some and none restores.
        """
        scan = self.scan(run_id)
        unreadable = dict(scan.unreadable)
        skipped: list[tuple[int, str]] = []
        for manifest in reversed(scan.manifests):
            skipped += sorted(((s, r) for s, r in unreadable.items() if s > manifest.step), reverse=True)
            unreadable = {s: r for s, r in unreadable.items() if s < manifest.step}
            try:
                state = self.load(manifest, into)
            except (CheckpointError, OSError, ValueError, RuntimeError) as exc:
                log.warning("skipping checkpoint step %d: %s", manifest.step, exc)
                skipped.append((manifest.step, str(exc)))
                continue
            return Restored(manifest=manifest, state=state, skipped=skipped)
        skipped += sorted(unreadable.items(), reverse=True)
        if skipped:
            raise nothing_restores(run_id, self.uri, skipped)
        return None

    def check_manifest(self, manifest: CheckpointManifest) -> None:
        """Raise CheckpointError unless the manifest is of this format, matches its own sha256 and is
        signed with this deployment's key."""
        self.check_content(manifest)
        self.signer.verify(manifest)

    def check_content(self, manifest: CheckpointManifest) -> None:
        """Raise CheckpointError unless the manifest is of this format and matches its own sha256."""
        if manifest.format_version not in READABLE_FORMATS:
            raise CheckpointError(
                f"manifest {manifest.uri} has format {manifest.format_version}; "
                f"this build reads formats {', '.join(map(str, READABLE_FORMATS))}"
            )
        if manifest.content_hash() != manifest.manifest_sha256:
            raise CheckpointError(f"manifest {manifest.uri} does not match its sha256 (edited or torn)")

    # ----- pins and retention ----------------------------------------------------------------
    def pin(self, run_id: str, step: int, reason: str) -> None:
        """Keep this checkpoint through retention and GC (a registered model, a running job)."""
        body = {"run_id": run_id, "step": step, "reason": reason, "created_at": datetime.now(UTC).isoformat()}
        self.storage.put(pin_key(run_id, step, reason), json.dumps(body).encode())

    def unpin(self, run_id: str, step: int, reason: str) -> None:
        self.storage.delete(pin_key(run_id, step, reason))

    def pins(self, run_id: str) -> list[Pin]:
        pins = []
        for key in self.storage.list(pin_prefix(run_id)):
            try:
                body = json.loads(self.storage.get(key))
                pins.append(Pin(body["run_id"], int(body["step"]), body["reason"], body["created_at"]))
            except (ValueError, KeyError, OSError) as exc:
                # An unreadable pin still protects its step: the step is in the key.
                log.warning("unreadable pin %s: %s", key, exc)
                pins.append(Pin(run_id, int(key.split("/")[2]), "unreadable pin", ""))
        return pins

    def apply_retention(self, run_id: str, policy: RetentionPolicy) -> list[int]:
        """Delete the manifests the policy does not keep; returns removed steps.

        Never removes a pinned checkpoint or the newest restorable one, and removes nothing when
        no checkpoint of the run restores (the run fails on restore instead; see restore_latest).
        """
        self._record_policy(run_id, policy)
        manifests = self.list(run_id)
        newest = next((m for m in reversed(by_save_time(manifests)) if self.restorable(m)), None)
        if newest is None:
            if manifests:
                log.warning("retention of run %s removes nothing: none of its checkpoints restores", run_id)
            return []
        pinned = {pin.step for pin in self.pins(run_id)} | {newest.step}
        keep = steps_to_keep(manifests, policy, pinned=pinned)
        removed = [m for m in manifests if m.step not in keep]
        for manifest in removed:
            record_removal(self.tier(manifest.tier), manifest, "retention")
            for _, tier in self._tiers_coldest_first():
                tier.delete(manifest_key(run_id, manifest.step))
        return [m.step for m in removed]

    def recorded_policy(self, run_id: str) -> RetentionPolicy | None:
        """The policy retention last applied to the run (None when none was, or it is unreadable)."""
        try:
            return RetentionPolicy(**json.loads(self.storage.get(retention_key(run_id))))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            log.warning("retention policy of run %s is unreadable: %s", run_id, exc)
            return None

    def _record_policy(self, run_id: str, policy: RetentionPolicy) -> None:
        # Read back when a pin goes (a model version deleted): the run may never save again.
        if self._policies.get(run_id) != policy:
            self.storage.put(retention_key(run_id), json.dumps(asdict(policy)).encode(), sync_parent=False)
            self._policies[run_id] = policy

    def prune(self, run_id: str, keep_last: int) -> list[int]:
        """Remove all but the newest ``keep_last`` manifests of a run (pins kept); returns removed steps."""
        return self.apply_retention(run_id, RetentionPolicy(keep_last=keep_last))

    def gc(self, grace_seconds: float = 3600.0, *, dry_run: bool = False) -> GcReport:
        """Delete chunks no manifest, pin or in-progress save references (hot and cold tiers).

        `dry_run`: delete nothing and report what would be freed.
        """
        report = collect_garbage(self.storage, grace_seconds, dry_run=dry_run)
        if self.cold is not None:
            report = report.merged(collect_garbage(self.cold, grace_seconds, dry_run=dry_run))
        return report

    def restorable(self, manifest: CheckpointManifest) -> bool:
        """The manifest verifies and every chunk is stored at its size, on one of the tiers.

        What retention can afford after every save (a stat per chunk, no reads): a chunk damaged
        at the same size is caught, and quarantined, by the first read (reader.py).
        """
        try:
            self.check_manifest(manifest)
        except CheckpointError:
            return False
        tiers = self.tiers_for(manifest)

        def stored(ref: ChunkRef) -> bool:
            return any(_holds(tier, ref) for tier in tiers)

        with ThreadPoolExecutor(max_workers=STAT_WORKERS) as pool:
            return all(pool.map(stored, manifest.chunks))

    # ----- helpers ---------------------------------------------------------------------------
    def _tiers_coldest_first(self) -> list[tuple[str, Storage]]:
        return ([("cold", self.cold)] if self.cold is not None else []) + [("hot", self.storage)]

    def tier(self, name: str) -> Storage:
        return self.cold if name == "cold" and self.cold is not None else self.storage

    def tiers_for(self, manifest: CheckpointManifest) -> list[Storage]:
        """The tiers to read its chunks from, its own first."""
        tiers = [self.storage] + ([self.cold] if self.cold is not None else [])
        return tiers[::-1] if manifest.tier == "cold" else tiers

    def located(self, manifest: CheckpointManifest, tier: str) -> CheckpointManifest:
        """The manifest with the uri and tier it has in this store."""
        key = manifest_key(manifest.run_id, manifest.step)
        return manifest.model_copy(update={"uri": f"{self.uri}/{key}", "tier": tier})


def nothing_restores(run_id: str, uri: str, skipped: list[tuple[int, str]]) -> CheckpointError:
    """The error for a run that has checkpoints of which none restores: it must not start over
    (its next saves and retention would then replace the progress it lost)."""
    reasons = "; ".join(f"step {step}: {reason}" for step, reason in skipped)
    return CheckpointError(
        f"run {run_id} has {len(skipped)} checkpoint{'s' if len(skipped) != 1 else ''} in {uri} and none "
        f"restores ({reasons}). The run does not start over and nothing was deleted: repair the store "
        "(README: 'When no checkpoint restores'), or train under a new run id."
    )


def open_store(uri: str | Path, cold_uri: str | None = None) -> CheckpointStore:
    """A store for a local directory (``/path``, ``file:///path``) or ``s3://bucket/prefix``.

    Without `cold_uri`, the cold tier the store records (`attach_cold_tier`), if any: every job,
    evaluation and GC of the store then sees the checkpoints tiering moved there.
    """
    storage = open_storage(uri)
    cold_uri = cold_uri or recorded_cold_uri(storage)
    return CheckpointStore(storage, open_storage(cold_uri) if cold_uri else None)


def recorded_cold_uri(storage: Storage) -> str | None:
    try:
        raw = storage.get(COLD_TIER_KEY)
    except FileNotFoundError:
        return None
    try:
        uri = json.loads(raw)["uri"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{storage.uri}/{COLD_TIER_KEY} is unreadable ({exc}): write it again with "
            'attach_cold_tier (tp gc does, from the lifecycle settings) or delete it if the store has no cold tier'
        ) from None
    return str(uri)


def attach_cold_tier(storage: Storage, cold_uri: str) -> CheckpointStore:
    """Record `cold_uri` as the store's cold tier (before anything moves there); returns the store."""
    cold = open_storage(cold_uri)
    if cold.uri == storage.uri or cold.uri.startswith(storage.uri + "/") or storage.uri.startswith(cold.uri + "/"):
        raise CheckpointError(
            f"cold tier {cold_uri} overlaps the store {storage.uri}: their chunks would be one set, and GC of "
            "either tier would delete the other's; use a separate directory or prefix"
        )
    recorded = recorded_cold_uri(storage)
    if recorded is not None and recorded != cold_uri:
        # Its checkpoints would vanish from every reader, and nothing would collect its chunks.
        raise CheckpointError(
            f"store {storage.uri} already has the cold tier {recorded}, not {cold_uri}: keep that cold_uri "
            "in the lifecycle settings, or copy its checkpoints over and edit " + f"{storage.uri}/{COLD_TIER_KEY}"
        )
    if recorded is None:
        storage.put(COLD_TIER_KEY, json.dumps({"uri": cold_uri}).encode())
    return CheckpointStore(storage, cold)


def _holds(tier: Storage, ref: ChunkRef) -> bool:
    """The tier has the chunk at its size: in its pack, or on its own."""
    if ref.pack is not None and (info := tier.stat(pack_key(ref.pack))) and info.size >= ref.offset + ref.size:
        return True
    return bool((info := tier.stat(chunk_key(ref.digest))) and info.size == ref.size)
