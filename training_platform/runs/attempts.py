"""Attempts of one run: resuming an unfinished attempt, or reproducing a finished one.

Materializing a run that has not finished (new, preempted, failed) continues it from its newest
checkpoint. Materializing a run that finished is a reproduction: it trains again from scratch
under its own checkpoint key, and its record is compared with the original's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RECORD_FILE = "record.json"  # the finished attempt's result + spec + lineage + environment
HISTORY_DIR = "history"  # earlier finished attempts, 1.json being the original
KEY_FILE = "checkpoint_key"


@dataclass(frozen=True)
class Attempt:
    checkpoint_key: str
    original: dict | None  # the run's first finished record, when this attempt reproduces it

    @property
    def is_reproduction(self) -> bool:
        return self.original is not None


def begin_attempt(run_dir: Path, run_id: str) -> Attempt:
    run_dir.mkdir(parents=True, exist_ok=True)
    history = run_dir / HISTORY_DIR
    record = run_dir / RECORD_FILE
    key_file = run_dir / KEY_FILE
    if record.is_file():
        history.mkdir(exist_ok=True)
        number = len(list(history.glob("*.json"))) + 1
        record.rename(history / f"{number}.json")
        key_file.write_text(f"{run_id}.repro{number}")
    elif not key_file.is_file():
        key_file.write_text(run_id)
    original = history / "1.json"
    return Attempt(
        checkpoint_key=key_file.read_text().strip(),
        original=json.loads(original.read_text()) if original.is_file() else None,
    )


def finish_attempt(run_dir: Path, record: dict) -> None:
    (run_dir / RECORD_FILE).write_text(json.dumps(record, indent=1, default=str))


def latest_record(run_dir: Path) -> dict | None:
    path = run_dir / RECORD_FILE
    return json.loads(path.read_text()) if path.is_file() else None
