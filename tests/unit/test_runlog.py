"""The run's event log read incrementally: a line still being written waits, a torn one is skipped."""

from __future__ import annotations

from training_platform.runlog import RunEvents


def test_reading_on_from_an_offset_leaves_a_half_written_line_for_later(tmp_path):
    events = RunEvents(tmp_path)
    assert events.read_from(0) == ([], 0)  # no log yet
    events.append("started", world_size=2)
    events.append("first_step")
    with open(events.path, "ab") as handle:
        handle.write(b'{"kind": "progress", "st')  # a writer mid-line
    first, offset = events.read_from(0)
    assert [e["kind"] for e in first] == ["started", "first_step"]
    assert offset < events.path.stat().st_size
    with open(events.path, "ab") as handle:
        handle.write(b'ep": 10}\n{"kind": "torn by a kill\n')
    events.append("checkpoint", step=10)
    later, end = events.read_from(offset)
    assert [(e["kind"], e.get("step")) for e in later] == [("progress", 10), ("checkpoint", 10)]
    assert end == events.path.stat().st_size
    assert [e["kind"] for e in events.read()] == ["started", "first_step", "progress", "checkpoint"]


def test_the_newest_kind_is_read_from_the_tail_alone(tmp_path):
    events = RunEvents(tmp_path)
    assert events.last_kind() is None  # no log yet
    events.append("started")
    for step in range(200):
        events.append("progress", step=step, note="x" * 40)
    events.append("time_limit", job_id="7")
    assert events.last_kind(tail_bytes=256) == "time_limit"  # the tail's cut first line is skipped
    with open(events.path, "ab") as handle:
        handle.write(b'{"kind": "progress", "st')  # a writer mid-line
    assert events.last_kind(tail_bytes=256) == "time_limit"
