"""The dataset snapshots the platform server has built, read over GraphQL: what `tp snapshots` lists and shows.

A snapshot is content-addressed: the same data gives the same id, so one snapshot may be the
materialization of several days (`dataset_snapshot` partitions). Its verdict is the blocking
Great Expectations check's evaluation that names it; a snapshot that failed it never trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training_platform.client.graphql import CheckResult, PlatformClient
from training_platform.errors import SpecError
from training_platform.spec.submission import SNAPSHOT_ASSET, SNAPSHOT_CHECK

MATERIALIZATIONS_READ = 500
"""How far back the listing reads (materializations, newest first): about a year of daily snapshots."""


@dataclass
class Snapshot:
    snapshot_id: str
    source: str
    rows: dict[str, int]
    built: float
    """When it was last materialized (seconds since the epoch)."""
    days: list[str] = field(default_factory=list)
    """The `dataset_snapshot` partitions that built it, newest first."""
    passed: bool | None = None
    """The expectations' verdict; None when no check evaluated it (a build that crashed before its check)."""
    shards: int | None = None
    bytes: int | None = None
    drops: int | None = None
    schema: dict[str, str] = field(default_factory=dict)
    check: CheckResult | None = None

    @property
    def verdict(self) -> str:
        return {True: "passed", False: "FAILED", None: "not checked"}[self.passed]

    def row(self) -> dict[str, Any]:
        """The listing's fields (and `tp snapshots --json`'s)."""
        return {
            "snapshot_id": self.snapshot_id,
            "source": self.source,
            "rows": sum(self.rows.values()),
            "splits": self.rows,
            "expectations": self.verdict,
            "built": self.built,
            "days": self.days,
        }

    def details(self) -> dict[str, Any]:
        """Everything `tp snapshots show` prints: the listing's fields, the schema and each expectation's result."""
        check = self.check
        return self.row() | {
            "shards": self.shards,
            "bytes": self.bytes,
            "drops_included": self.drops,
            "schema": self.schema,
            "check": None
            if check is None
            else {
                "summary": check.description,
                "expectations": check.metadata.get("expectations"),
                "failed": check.metadata.get("failed") or [],
            },
        }


def list_snapshots(client: PlatformClient, source: str | None = None) -> list[Snapshot]:
    """Every snapshot the server built (of `source`, when given), the most recently built first."""
    found: dict[str, Snapshot] = {}
    for metadata, timestamp in client.asset_materializations(SNAPSHOT_ASSET, None, limit=MATERIALIZATIONS_READ):
        snapshot_id = metadata.get("snapshot_id")
        if not snapshot_id or (source is not None and metadata.get("source") != source):
            continue
        snapshot = found.get(snapshot_id)
        if snapshot is None:
            snapshot = found[snapshot_id] = Snapshot(
                snapshot_id=snapshot_id,
                source=metadata.get("source", "?"),
                rows=metadata.get("rows") or {},
                built=timestamp,
                passed=metadata.get("expectations_passed"),
                shards=metadata.get("shards"),
                bytes=metadata.get("bytes"),
                drops=metadata.get("drops_included"),
                schema=metadata.get("schema") or {},
            )
        if metadata.get("day") and metadata["day"] not in snapshot.days:
            snapshot.days.append(metadata["day"])
    return list(found.values())


def show_snapshot(client: PlatformClient, ref: str) -> Snapshot:
    """One snapshot by its id or a unique prefix of it, with its check's evaluation."""
    if not ref or len(ref) > 64 or any(c not in "0123456789abcdef" for c in ref):
        raise SpecError(f"{ref!r} is not a snapshot id: 64 lowercase hex characters (or a prefix; see `tp snapshots`)")
    matches = [s for s in list_snapshots(client) if s.snapshot_id.startswith(ref)]
    if not matches:
        raise SpecError(f"no snapshot {ref} on the platform server at {client.url}; list them with `tp snapshots`")
    if len(matches) > 1:
        raise SpecError(f"{ref} names {len(matches)} snapshots; give more of the id (see `tp snapshots`)")
    snapshot = matches[0]
    evaluations = client.check_evaluations(SNAPSHOT_ASSET, SNAPSHOT_CHECK)  # newest first
    snapshot.check = next((c for c in evaluations if c.metadata.get("snapshot_id") == snapshot.snapshot_id), None)
    if snapshot.check is not None:
        snapshot.passed = snapshot.check.passed
    return snapshot
