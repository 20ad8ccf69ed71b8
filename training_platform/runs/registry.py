"""Where the run registry keeps each run's spec: a file per run in the home, or a table of the platform's database.

On one machine a run's spec is `runs/<id>/submitted_spec.json` in the home. On a team's deployment
(``TP_DATABASE_URL``) the webserver, the daemon and every run worker may be different machines or pods,
and each must read the spec a run was created with from its id alone: there it is a row of `tp_runs`.
Either way a run's spec is written once: a second registration finds the first. This module holds the interface and
the file registry, registry_db.py the database one; backends.py chooses between them (`open_run_registry`).
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod

from training_platform.paths import PlatformHome

SUBMITTED_SPEC = "submitted_spec.json"
TRIAL_FILE = "sweep_trial.json"


class RunRegistry(ABC):
    where: str  # where the specs are, as a message may name it

    @abstractmethod
    def add(self, run_id: str, team: str, spec_json: str, trial_json: str | None = None) -> str:
        """Record `spec_json` as the run's spec, with its sweep trial's context if it is one, unless the run has a
        spec; returns the run's spec as recorded."""

    @abstractmethod
    def get(self, run_id: str) -> str | None:
        """The run's recorded spec (JSON), or None for a run never registered."""

    @abstractmethod
    def trial(self, run_id: str) -> str | None:
        """The context (JSON) of the sweep trial the run is, or None for a run outside sweeps."""

    @abstractmethod
    def specs(self) -> dict[str, str]:
        """Every registered run's spec, by run id."""


class FileRunRegistry(RunRegistry):
    def __init__(self, home: PlatformHome):
        self.home = home
        self.where = str(home.runs)

    def add(self, run_id: str, team: str, spec_json: str, trial_json: str | None = None) -> str:
        path = self.home.run_dir(run_id) / SUBMITTED_SPEC
        path.parent.mkdir(parents=True, exist_ok=True)
        if trial_json is not None and not path.exists():  # before the spec: a registered trial has its context
            (path.parent / TRIAL_FILE).write_text(trial_json)
        fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{SUBMITTED_SPEC}.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(spec_json)
            os.link(staged, path)  # whole or absent, and never over another registration's spec
        except FileExistsError:
            pass
        finally:
            os.unlink(staged)
        return path.read_text()

    def get(self, run_id: str) -> str | None:
        path = self.home.run_dir(run_id) / SUBMITTED_SPEC
        return path.read_text() if path.is_file() else None

    def trial(self, run_id: str) -> str | None:
        path = self.home.run_dir(run_id) / TRIAL_FILE
        return path.read_text() if path.is_file() else None

    def specs(self) -> dict[str, str]:
        if not self.home.runs.is_dir():
            return {}
        found = {}
        for path in sorted(self.home.runs.glob(f"*/{SUBMITTED_SPEC}")):
            try:
                found[path.parent.name] = path.read_text()
            except OSError:  # removed while we listed
                continue
        return found
