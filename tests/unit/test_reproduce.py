"""Comparing a reproduction with its original: exact, or a precise diff."""

from training_platform.runs.reproduce import compare, package_differences


def record(**changes):
    base = {
        "run_id": "r1",
        "final_weights_sha256": "a" * 64,
        "device": "cpu",
        "metrics": {"val_accuracy": 0.95},
        "environment": ["numpy==2.0", "torch==2.13.0"],
        "lineage": {
            "code_commit": "c1",
            "code_dirty": False,
            "snapshot_id": "s1",
            "spec_hash": "h",
            "seed": 7,
            "backend": "local",
        },
    }
    lineage = {**base["lineage"], **changes.pop("lineage", {})}
    return {**base, **changes, "lineage": lineage}


def test_identical_records_reproduce_exactly():
    report = compare(record(), record())
    assert report.exact and report.passed
    assert report.summary().startswith("reproduced exactly")


def test_code_and_package_changes_are_named_even_when_weights_agree():
    report = compare(record(), record(lineage={"code_commit": "c2"}, environment=["numpy==2.1", "torch==2.13.0"]))
    assert report.weights_equal and report.passed and not report.exact
    assert report.differences == ["code commit: c1 -> c2", "package numpy: 2.0 -> 2.1"]


def test_different_weights_fail_on_cpu_and_name_the_snapshot():
    report = compare(record(), record(final_weights_sha256="b" * 64, lineage={"snapshot_id": "s2"}))
    assert not report.passed
    assert "dataset snapshot: s1 -> s2" in report.summary()


def test_other_devices_are_judged_by_metric_tolerance():
    close = record(final_weights_sha256="b" * 64, device="cuda", metrics={"val_accuracy": 0.9504})
    assert compare(record(), close).passed
    far = record(final_weights_sha256="b" * 64, device="cuda", metrics={"val_accuracy": 0.93})
    assert not compare(record(), far).passed


def test_a_dirty_original_is_the_reason_it_cannot_be_exact():
    report = compare(record(lineage={"code_dirty": True}), record())
    assert not report.exact
    assert "dirty tree" in report.reasons_not_exact[0]


def test_package_differences_cover_added_and_removed():
    assert package_differences(["a==1", "b==1"], ["b==1", "c==2"]) == ["package a: removed 1", "package c: added 2"]
