"""Small named JSON records the platform's parts share (the sweeps waiting for or running in their cost window,
the runs waiting for theirs), and the locks they take.

On the embedded default each record is a file of the home (`<directory>/<name>.json`): `FileDocuments`, here. On a
team's deployment (``TP_DATABASE_URL``) the webserver, the daemon and the code server may be different machines or
pods, and a record one of them writes must be read by the others: there each record is a row of `tp_documents`,
keyed by its kind and name (documents_db.py). Either way a record is replaced whole, never seen half-written.
Which of the two a deployment uses is chosen above both, in backends.py (`open_documents`, `shared_lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training_platform.identifiers import check_run_id, contained


class Documents(ABC):
    """The records of one kind, by name (a name is one plain word: `check_run_id`)."""

    kind: str

    @abstractmethod
    def get(self, name: str) -> dict[str, Any] | None:
        """The record, or None when there is none."""

    @abstractmethod
    def put(self, name: str, record: dict[str, Any]) -> None:
        """Write the record whole, over any earlier one."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every record's name, sorted."""

    @abstractmethod
    def locked(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The record to this process alone while the block runs (other holders wait), on whichever machine."""

    @abstractmethod
    def where(self, name: str) -> str:
        """Where the record is, as a message may name it."""


class FileDocuments(Documents):
    def __init__(self, root: Path, kind: str):
        self.root = root
        self.kind = kind

    def path(self, name: str) -> Path:
        # `name` may be a Dagster partition key typed in the UI: one plain name under the directory.
        return contained(self.root, f"{check_run_id(name, f'{self.kind} name')}.json")

    def get(self, name: str) -> dict[str, Any] | None:
        path = self.path(name)
        return json.loads(path.read_text()) if path.is_file() else None

    def put(self, name: str, record: dict[str, Any]) -> None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # readers poll these files every few seconds
        staged.write_text(json.dumps(record, indent=2))
        staged.replace(path)

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.json")) if self.root.is_dir() else []

    def locked(self, name: str) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.path(name).with_suffix(".lock"))

    def where(self, name: str) -> str:
        return str(self.path(name))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) for the block: one machine's processes only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
