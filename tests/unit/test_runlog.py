"""The run's event log read incrementally: a line still being written waits, a torn one is skipped; a reader that
polls parses only what was added since it last looked."""

from __future__ import annotations

from training_platform.runs import events as runlog
from training_platform.runs.events import RunEvents


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


def test_a_polling_reader_parses_only_what_was_added(tmp_path, monkeypatch):
    events = RunEvents(tmp_path)
    events.append("started")
    events.append("progress", step=5)
    asked = []
    parse_from = runlog._parse_from
    monkeypatch.setattr(runlog, "_parse_from", lambda file, offset: asked.append(offset) or parse_from(file, offset))
    assert [e["kind"] for e in events.read()] == ["started", "progress"]
    end = events.path.stat().st_size
    events.append("progress", step=10)
    with open(events.path, "ab") as handle:
        handle.write(b'{"kind": "checkpoint", "st')  # a writer mid-line
    assert [e.get("step") for e in RunEvents(tmp_path).read()] == [None, 5, 10]  # another reader of the same log
    assert asked == [0, end]
    with open(events.path, "ab") as handle:
        handle.write(b'ep": 10}\n')
    assert [e["kind"] for e in events.read()][-1] == "checkpoint"


def test_what_a_caller_changes_in_the_events_it_read_is_not_read_again(tmp_path):
    events = RunEvents(tmp_path)
    events.append("progress", step=5)
    first = events.read()
    first[0]["step"] = 99
    first.append({"kind": "made up"})
    assert events.read() == [{"kind": "progress", "at": first[0]["at"], "step": 5}]


def test_a_log_written_anew_at_the_same_path_is_read_anew(tmp_path):
    events = RunEvents(tmp_path)
    for step in range(3):
        events.append("progress", step=step)
    assert len(events.read()) == 3
    events.path.unlink()  # the run directory cleared, the run id used again
    events.append("started", attempt=2)
    assert [e["kind"] for e in events.read()] == ["started"]
    # Rewritten with the same first line and less after it: read anew too.
    first_line = events.path.read_bytes()
    events.append("progress", step=1)
    assert len(events.read()) == 2
    events.path.write_bytes(first_line)
    assert [e["kind"] for e in events.read()] == ["started"]


def test_a_process_keeps_only_the_newest_logs_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(runlog, "PARSED_LOGS", 2)
    logs = [RunEvents(tmp_path / str(n)) for n in range(3)]
    for log in logs:
        log.path.parent.mkdir()
        log.append("started")
        assert len(log.read()) == 1
    assert list(runlog._parsed) == [str(log.path) for log in logs[1:]]
