"""A run's event log: one JSON object per line in its run directory, appended by rank 0.

The log outlives any one process, so the orchestrator can tell what happened to a job that was
preempted or killed: the last step it reached, the checkpoint it resumed from, when it resumed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from training_platform.runs.layout import EVENTS_FILE

MOVED_TO_ON_DEMAND = "moved_to_on_demand"  # a requeued spot job moved to on-demand (requeue.py); priced so after
NODE_FAILURE = "node_failure"  # a node of the job stopped answering: this attempt's ranks there are lost
TIME_LIMIT = "time_limit"  # the scheduler's wall time limit stopped this attempt (the batch script writes it)
# How many logs a process keeps parsed (read()): a sensor's tick or a test's wait reads the same few again and again.
PARSED_LOGS = 64
# A log's first bytes, kept with what was parsed of it: a log written anew at the same path starts otherwise (the
# first event's time), so its parse is not mistaken for the old one's.
HEAD_BYTES = 64


@dataclass
class _Parsed:
    head: bytes
    offset: int
    events: list[dict[str, Any]] = field(default_factory=list)


_parsed: OrderedDict[str, _Parsed] = OrderedDict()
_parsed_lock = threading.Lock()


class RunEvents:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / EVENTS_FILE

    def append(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "at": time.time(), **fields}) + "\n"
        # One write() of a short line with O_APPEND: lines from restarts never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        """Every whole event so far. The log is only appended to, so what this process parsed of it before is kept
        (the PARSED_LOGS newest logs read): a reader that polls a run's log parses only what was added since it
        last looked, not the whole log each time (a long run's log has thousands of lines)."""
        key = str(self.path)
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, after the parse
        except FileNotFoundError:
            return []
        with handle:
            head, size = handle.read(HEAD_BYTES), os.fstat(handle.fileno()).st_size
            with _parsed_lock:
                parsed = _parsed.pop(key, None)
            if parsed is None or head[: len(parsed.head)] != parsed.head or size < parsed.offset:
                parsed = _Parsed(head=head, offset=0)  # first read, or a log written anew
            added, parsed.offset = _parse_from(handle, parsed.offset)
        parsed.events.extend(added)
        parsed.head = head
        with _parsed_lock:
            _parsed[key] = parsed
            while len(_parsed) > PARSED_LOGS:
                _parsed.popitem(last=False)
        return [dict(event) for event in parsed.events]  # a caller may change what it was given

    def last_kind(self, tail_bytes: int = 4096) -> str | None:
        """The kind of the newest whole event, from the log's tail alone (launchers ask on every poll)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - tail_bytes))
                lines = handle.read().splitlines(keepends=True)
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            if line.endswith(b"\n"):
                try:
                    return json.loads(line).get("kind")
                except (json.JSONDecodeError, AttributeError):
                    continue  # a torn line, or the tail's cut first line
        return None

    def read_from(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The events after byte OFFSET, and the offset to read on from (a line still being written is
        left for then)."""
        if not self.path.is_file():
            return [], offset
        with open(self.path, "rb") as handle:
            return _parse_from(handle, offset)


def _parse_from(handle: BinaryIO, offset: int) -> tuple[list[dict[str, Any]], int]:
    """RunEvents.read_from on an open log."""
    handle.seek(offset)
    lines = handle.read().splitlines(keepends=True)
    events = []
    for line in lines:
        if not line.endswith(b"\n"):
            break
        offset += len(line)
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill mid-write carries no information
    return events, offset
