"""Pins for registered model versions: the checkpoint behind every version stays while the version does.

`registered_model` pins a version's checkpoint when it registers it. Deleting or archiving a version
happens in MLflow, which tells nobody, so each lifecycle pass re-derives the pins from the registry:
a version's `checkpoint_uri` tag names its store, run key and step; pins of versions that are gone
or archived are removed, and missing ones are written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from training_platform.checkpoints.layout import step_of_manifest_key
from training_platform.checkpoints.store import CheckpointStore

log = logging.getLogger(__name__)

PIN_PREFIX = "model "


def model_pin_reason(model_name: str, version: str) -> str:
    return f"{PIN_PREFIX}{model_name} v{version}"


@dataclass(frozen=True)
class VersionCheckpoint:
    """Where a registered version's checkpoint lives."""

    checkpoint_uri: str
    reason: str

    def location_in(self, store: CheckpointStore) -> tuple[str, int] | None:
        """(run key, step) when the checkpoint is in this store (on either tier), else None."""
        tiers = [store.storage] + ([store.cold] if store.cold is not None else [])
        for tier in tiers:
            head = f"{tier.uri}/runs/"
            if self.checkpoint_uri.startswith(head):
                run_id, _, name = self.checkpoint_uri.removeprefix(head).partition("/")
                step = step_of_manifest_key(name)
                return (run_id, step) if run_id and step is not None and "/" not in name else None
        return None


def registered_checkpoints(tracking_uri: str) -> list[VersionCheckpoint]:
    """Every model version that exists and is not archived, with the checkpoint it came from.

    Raises what MLflow raises when the registry cannot be read: the caller then leaves pins alone.
    """
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        return []  # nothing registered yet (opening it would create the database)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = []
    for version in _all_versions(client):
        uri = (version.tags or {}).get("checkpoint_uri")
        if uri and version.current_stage != "Archived":
            found.append(VersionCheckpoint(uri, model_pin_reason(version.name, str(version.version))))
    return found


def _all_versions(client) -> list:
    versions, token = [], None
    while True:
        page = client.search_model_versions(max_results=1000, page_token=token)
        versions += list(page)
        token = page.token
        if not token:
            return versions


Pinned = tuple[str, int, str]
"""(run key, step, reason)"""


@dataclass
class PinChanges:
    added: list[Pinned]
    removed: list[Pinned]


def reconcile_pins(store: CheckpointStore, versions: list[VersionCheckpoint]) -> PinChanges:
    """Make the store's model pins exactly those of the registry's versions whose checkpoint it holds.

    A run that lost a pin has its recorded retention policy applied again: it may never save again.
    """
    wanted: set[Pinned] = set()
    for version in versions:
        location = version.location_in(store)
        if location is not None:
            wanted.add((*location, version.reason))
    changes = PinChanges([], [])
    present: set[Pinned] = set()
    for run_id in sorted({key.split("/")[1] for key in store.storage.list("pins")}):
        for pin in store.pins(run_id):
            if not pin.reason.startswith(PIN_PREFIX):
                continue  # a pin someone else keeps (a running job, an operator)
            present.add((pin.run_id, pin.step, pin.reason))
            if (pin.run_id, pin.step, pin.reason) not in wanted:
                store.unpin(pin.run_id, pin.step, pin.reason)
                changes.removed.append((pin.run_id, pin.step, pin.reason))
    for run_id, step, reason in sorted(wanted - present):
        if any(manifest.step == step for manifest in store.list(run_id)):
            store.pin(run_id, step, reason)
            changes.added.append((run_id, step, reason))
    for run_id in sorted({run_id for run_id, _, _ in changes.removed}):
        if (policy := store.recorded_policy(run_id)) is not None:
            store.apply_retention(run_id, policy)
    return changes
