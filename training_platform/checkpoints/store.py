"""CheckpointStore: atomic, verified, deduplicated checkpoints on a storage tier (plus a cold one).

Layout under the store root: see layout.py. Save order: every chunk (skipped when already
present), then the manifest. A crash at any point leaves either the previous checkpoint or
the new one visible, never a torn one. Restore verifies the manifest's own hash and every
chunk's hash and falls back to older checkpoints, saying which it skipped and why.

The tensor modules are imported where tensors are read or written: the background writer
process applies retention through this class and starts without importing torch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training_platform.checkpoints.layout import (
    manifest_key,
    pin_key,
    pin_prefix,
    run_prefix,
    step_of_manifest_key,
)
from training_platform.checkpoints.manifest import READABLE_FORMATS, CheckpointManifest, parse_manifest
from training_platform.checkpoints.retention import GcReport, RetentionPolicy, collect_garbage, steps_to_keep
from training_platform.checkpoints.storage import LocalStorage, Storage, validate_key
from training_platform.checkpoints.writer import LEASE_SETTLE_SECONDS, SaveStats, write_checkpoint
from training_platform.errors import CheckpointError

log = logging.getLogger(__name__)

__all__ = ["CheckpointStore", "Restored", "SaveStats", "open_store"]


@dataclass
class Restored:
    manifest: CheckpointManifest
    state: Any
    skipped: list[tuple[int, str]] = field(default_factory=list)


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
        lease_settle_seconds: float = LEASE_SETTLE_SECONDS,
    ):
        self.storage = storage
        self.cold = cold
        self.uri = storage.uri
        self.lease_settle_seconds = lease_settle_seconds

    # ----- writing -------------------------------------------------------------------------
    def save(
        self,
        run_id: str,
        step: int,
        state: Any,
        metrics: dict[str, float] | None = None,
        *,
        stall_seconds: float = 0.0,
    ) -> tuple[CheckpointManifest, SaveStats]:
        """Write a checkpoint synchronously; returns (manifest, stats)."""
        from training_platform.checkpoints.serialization import flatten_state, tensor_blob

        skeleton, tensors = flatten_state(state)
        manifest, stats = write_checkpoint(
            self.storage,
            run_id,
            step,
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
    ) -> tuple[CheckpointManifest, SaveStats]:
        """Checkpoint a directory's files (DCP shards, DeepSpeed output) as chunks; manifest last."""
        for name in files:
            validate_key(name)
        manifest, stats = write_checkpoint(
            self.storage,
            run_id,
            step,
            files=files,
            metrics=metrics,
            attributes=attributes,
            lease_settle_seconds=self.lease_settle_seconds,
        )
        return self.located(manifest, "hot"), stats

    # ----- reading -------------------------------------------------------------------------
    def list(self, run_id: str) -> list[CheckpointManifest]:
        """Manifests of the run that parse, oldest first, from every tier (not yet hash-verified).

        Raises CheckpointError when the run has a checkpoint of a newer format than this build's.
        """
        return self._scan(run_id)[0]

    def _scan(self, run_id: str) -> tuple[list[CheckpointManifest], dict[int, str]]:
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
                found[manifest.step] = manifest.model_copy(update={"uri": f"{tier.uri}/{key}", "tier": tier_name})
                unreadable.pop(manifest.step, None)
        if newer:
            # Resuming from an older checkpoint would save over the newer ones: leave the run alone.
            step = max(newer)
            raise CheckpointError(f"run {run_id} has a checkpoint this build cannot read at step {step}: {newer[step]}")
        return [found[step] for step in sorted(found)], unreadable

    def run_ids(self) -> list[str]:
        """Every run with at least one manifest on any tier."""
        runs = set()
        for _, tier in self._tiers_coldest_first():
            runs.update(key.split("/")[1] for key in tier.list("runs") if key.count("/") >= 2)
        return sorted(runs)

    def load(self, manifest: CheckpointManifest) -> Any:
        """Load and verify one checkpoint; raises CheckpointError naming the bad file."""
        self.check_manifest(manifest)
        if manifest.kind != "state":
            raise CheckpointError(
                f"checkpoint {manifest.uri} holds files ({manifest.kind}); restore it with restore_files "
                "or training_platform.checkpoints.sharded.load_sharded"
            )
        from training_platform.checkpoints.reader import ChunkReader, read_tensors
        from training_platform.checkpoints.serialization import unflatten_state

        tiers = self._tiers_for(manifest)
        skeleton = ChunkReader(tiers).read(manifest.skeleton) if manifest.skeleton else None
        tensors = read_tensors(tiers, manifest)
        if skeleton is None:
            raise CheckpointError(f"checkpoint {manifest.uri} has no state skeleton")
        return unflatten_state(bytes(skeleton), tensors)

    def restore_files(self, manifest: CheckpointManifest, dest: Path) -> dict[str, Path]:
        """Write a files checkpoint into `dest`, verifying every chunk; returns name -> path."""
        from training_platform.checkpoints.reader import ChunkReader

        self.check_manifest(manifest)
        reader = ChunkReader(self._tiers_for(manifest))
        paths = {}
        for name, ref in manifest.files.items():
            path = Path(dest) / validate_key(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as handle:
                for chunk in ref.chunks:
                    handle.write(reader.read(chunk))
            paths[name] = path
        return paths

    def restore_latest(self, run_id: str) -> Restored | None:
        """The newest checkpoint whose hashes verify; older ones are tried in turn."""
        manifests, unreadable = self._scan(run_id)
        skipped: list[tuple[int, str]] = []
        for manifest in reversed(manifests):
            skipped += sorted(((s, r) for s, r in unreadable.items() if s > manifest.step), reverse=True)
            unreadable = {s: r for s, r in unreadable.items() if s < manifest.step}
            try:
                state = self.load(manifest)
            except (CheckpointError, OSError, ValueError, RuntimeError) as exc:
                log.warning("skipping checkpoint step %d: %s", manifest.step, exc)
                skipped.append((manifest.step, str(exc)))
                continue
            return Restored(manifest=manifest, state=state, skipped=skipped)
        return None

    def check_manifest(self, manifest: CheckpointManifest) -> None:
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
        """Delete the manifests the policy does not keep (never a pinned one); returns removed steps."""
        manifests = self.list(run_id)
        keep = steps_to_keep(manifests, policy, pinned={pin.step for pin in self.pins(run_id)})
        removed = [m.step for m in manifests if m.step not in keep]
        for step in removed:
            for _, tier in self._tiers_coldest_first():
                tier.delete(manifest_key(run_id, step))
        return removed

    def prune(self, run_id: str, keep_last: int) -> list[int]:
        """Remove all but the newest ``keep_last`` manifests of a run (pins kept); returns removed steps."""
        return self.apply_retention(run_id, RetentionPolicy(keep_last=keep_last))

    def gc(self, grace_seconds: float = 3600.0) -> GcReport:
        """Delete chunks no manifest, pin or in-progress save references (hot and cold tiers)."""
        report = collect_garbage(self.storage, grace_seconds)
        if self.cold is not None:
            report = report.merged(collect_garbage(self.cold, grace_seconds))
        return report

    # ----- helpers ---------------------------------------------------------------------------
    def _tiers_coldest_first(self) -> list[tuple[str, Storage]]:
        return ([("cold", self.cold)] if self.cold is not None else []) + [("hot", self.storage)]

    def _tiers_for(self, manifest: CheckpointManifest) -> list[Storage]:
        tiers = [self.storage] + ([self.cold] if self.cold is not None else [])
        return tiers[::-1] if manifest.tier == "cold" else tiers

    def located(self, manifest: CheckpointManifest, tier: str) -> CheckpointManifest:
        """The manifest with the uri and tier it has in this store."""
        key = manifest_key(manifest.run_id, manifest.step)
        return manifest.model_copy(update={"uri": f"{self.uri}/{key}", "tier": tier})


def open_store(uri: str | Path, cold_uri: str | None = None) -> CheckpointStore:
    """A store for a local directory (``/path``, ``file:///path``) or ``s3://bucket/prefix``."""
    return CheckpointStore(open_storage(uri), open_storage(cold_uri) if cold_uri else None)


def open_storage(uri: str | Path) -> Storage:
    text = str(uri)
    if text.startswith("s3://"):
        from training_platform.checkpoints.s3 import S3Storage  # boto3 only when asked for

        return S3Storage.from_uri(text)
    if "://" in text and not text.startswith("file://"):
        raise CheckpointError(f"unsupported checkpoint store URI {text!r}: use a local path or s3://bucket/prefix")
    return LocalStorage(Path(text.removeprefix("file://")))
