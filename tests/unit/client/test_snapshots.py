"""How `tp snapshots` reads the server's answers: one snapshot per id whatever the days that built it, a verdict
from the check that names it, and ids refused or resolved by prefix. (The server itself: test_retraining.py.)"""

from __future__ import annotations

import pytest

from training_platform.client.graphql import CheckResult, PlatformClient
from training_platform.client.snapshots import list_snapshots, show_snapshot
from training_platform.errors import SpecError

A, B = "a" * 64, "ab" + "0" * 62


class Answers(PlatformClient):
    """The two GraphQL reads, answered from lists (newest first, as the server answers)."""

    def __init__(self, materializations, evaluations):
        super().__init__("http://127.0.0.1:1")
        self.materializations, self.evaluations = materializations, evaluations

    def asset_materializations(self, asset, partition, limit=50):
        return self.materializations

    def check_evaluations(self, asset, check, limit=100):
        return self.evaluations


def _built(snapshot_id: str, day: str, at: float, passed: bool = True) -> tuple[dict, float]:
    metadata = {
        "snapshot_id": snapshot_id,
        "day": day,
        "source": "digits_daily",
        "expectations_passed": passed,
        "rows": {"train": 8, "validation": 1, "test": 1},
    }
    return metadata, at


def test_a_snapshot_built_on_several_days_is_listed_once_newest_first():
    answers = Answers([_built(B, "2026-11-05", 30), _built(A, "2026-11-04", 20), _built(A, "2026-11-03", 10)], [])
    listed = list_snapshots(answers)
    assert [(s.snapshot_id, s.days, s.built) for s in listed] == [
        (B, ["2026-11-05"], 30),
        (A, ["2026-11-04", "2026-11-03"], 20),
    ]
    assert listed[0].row()["rows"] == 10
    assert list_snapshots(answers, source="sklearn_digits") == []


def test_show_takes_a_unique_prefix_and_the_check_that_names_the_snapshot():
    failed = CheckResult(
        "dataset_snapshot",
        "dataset_snapshot_expectations",
        False,
        "1 of 9 failed",
        {"snapshot_id": B, "expectations": 9, "failed": [{"expectation": "e", "column": "label"}]},
    )
    other = CheckResult("dataset_snapshot", "dataset_snapshot_expectations", True, "all passed", {"snapshot_id": A})
    answers = Answers([_built(B, "2026-11-05", 30, passed=False), _built(A, "2026-11-04", 20)], [failed, other])
    shown = show_snapshot(answers, "ab0")
    assert shown.snapshot_id == B and shown.verdict == "FAILED"
    assert shown.details()["check"]["failed"] == [{"expectation": "e", "column": "label"}]
    with pytest.raises(SpecError, match="names 2 snapshots"):
        show_snapshot(answers, "a")
    with pytest.raises(SpecError, match="no snapshot"):
        show_snapshot(answers, "b")
    with pytest.raises(SpecError, match="not a snapshot id"):
        show_snapshot(answers, "../etc")
