"""One lifecycle pass over every store of a home: re-derive model pins, tier old checkpoints, collect.

Run by the `checkpoint_lifecycle` schedule and by `tp gc`. Order matters: pins first (tiering and
retention respect them), tiering next (the hot copies it leaves become garbage), GC last. A store
that fails is reported and the others go on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from training_platform.checkpoints.retention import GcReport
from training_platform.checkpoints.store import CheckpointStore, attach_cold_tier, open_storage, open_store
from training_platform.checkpoints.tiering import TieringPolicy, apply_tiering, to_move
from training_platform.errors import PlatformError
from training_platform.lifecycle.registry import PinChanges, VersionCheckpoint, reconcile_pins, registered_checkpoints
from training_platform.lifecycle.settings import LifecycleSettings
from training_platform.lifecycle.stores import home_store_uris
from training_platform.paths import PlatformHome

log = logging.getLogger(__name__)


@dataclass
class StoreReport:
    uri: str
    cold_uri: str | None
    gc: GcReport | None = None
    tiered: dict[str, list[int]] = field(default_factory=dict)
    """run key -> steps moved to the cold tier (or that would be, in a dry run)"""
    pins: PinChanges | None = None
    error: str | None = None


@dataclass
class LifecycleReport:
    dry_run: bool
    grace_seconds: float
    stores: list[StoreReport]
    registry_error: str | None = None
    """why the registry could not be read (pins were then left as they were)"""

    @property
    def freed_bytes(self) -> int:
        return sum(s.gc.deleted_bytes for s in self.stores if s.gc)

    @property
    def freed_chunks(self) -> int:
        return sum(s.gc.deleted_chunks for s in self.stores if s.gc)

    def as_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "grace_seconds": self.grace_seconds,
            "freed_bytes": self.freed_bytes,
            "freed_chunks": self.freed_chunks,
            "registry_error": self.registry_error,
            "stores": [_store_dict(s) for s in self.stores],
        }


def _store_dict(store: StoreReport) -> dict:
    gc = store.gc
    return {
        "uri": store.uri,
        "cold_uri": store.cold_uri,
        "error": store.error,
        "stored_bytes": gc.stored_bytes if gc else None,
        "freed_bytes": gc.deleted_bytes if gc else 0,
        "freed_chunks": gc.deleted_chunks if gc else 0,
        "young_chunks": gc.young_chunks if gc else 0,
        "postponed_chunks": gc.postponed_chunks if gc else 0,
        "put_back_chunks": gc.put_back_chunks if gc else 0,
        "skipped": gc.skipped if gc else {},
        "by_run": {run or "(unattributed)": vars(f) for run, f in sorted(gc.by_run.items())} if gc else {},
        "tiered": store.tiered,
        "pins_added": [list(pin) for pin in store.pins.added] if store.pins else [],
        "pins_removed": [list(pin) for pin in store.pins.removed] if store.pins else [],
    }


def run_lifecycle(
    home: PlatformHome,
    settings: LifecycleSettings,
    tracking_uri: str,
    *,
    dry_run: bool = False,
    grace_seconds: float | None = None,
    default_store_uri: str | None = None,
    now: datetime | None = None,
) -> LifecycleReport:
    """Pins, tiering and GC for every store of the home; `dry_run` changes nothing."""
    grace = settings.grace_hours * 3600 if grace_seconds is None else grace_seconds
    default = default_store_uri or str(home.checkpoints)
    versions: list[VersionCheckpoint] | None
    registry_error = None
    try:
        versions = registered_checkpoints(tracking_uri)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds; pins then stay as they are
        versions, registry_error = None, f"{type(exc).__name__}: {exc}"
        log.warning("model registry %s unreadable, pins left as they are: %s", tracking_uri, registry_error)
    cold_tiers = settings.cold_tier_by_store(default)
    stores = []
    for uri in home_store_uris(home, settings, default):
        report = StoreReport(uri, cold_tiers.get(open_storage(uri).uri))
        try:
            _one_store(report, versions, settings, grace, dry_run, now or datetime.now(UTC))
        except (PlatformError, OSError) as exc:
            report.error = str(exc)
            log.warning("checkpoint lifecycle of %s stopped: %s", uri, exc)
        stores.append(report)
    return LifecycleReport(dry_run, grace, stores, registry_error)


def _one_store(
    report: StoreReport,
    versions: list[VersionCheckpoint] | None,
    settings: LifecycleSettings,
    grace: float,
    dry_run: bool,
    now: datetime,
) -> None:
    store = _open(report, dry_run)
    if versions is not None and not dry_run:
        report.pins = reconcile_pins(store, versions)
    if store.cold is not None:
        policy = TieringPolicy(keep_hot_last=settings.keep_hot_last, older_than_days=settings.tier_after_days)
        for run_id in store.run_ids():
            if dry_run:
                steps = [m.step for m in to_move(store, run_id, policy, now)]
            else:
                steps = apply_tiering(store, run_id, policy, now=now).moved_steps
            if steps:
                report.tiered[run_id] = steps
    report.gc = store.gc(grace_seconds=grace, dry_run=dry_run)


def _open(report: StoreReport, dry_run: bool) -> CheckpointStore:
    if report.cold_uri is None:
        store = open_store(report.uri)
        report.cold_uri = store.cold.uri if store.cold is not None else None  # attached before
        return store
    if dry_run:
        return open_store(report.uri, cold_uri=report.cold_uri)
    return attach_cold_tier(open_storage(report.uri), report.cold_uri)
