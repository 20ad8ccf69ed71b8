"""Where the platform keeps its state on one machine (the embedded default).

Everything lives under one project data directory: ``$TP_HOME`` when set, else ``.data/``
in the current project. Each part gets a subdirectory so that a user can find, back up or
delete it by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from training_platform.identifiers import check_run_id, contained

SNAPSHOT_STORE_ENV = "TP_SNAPSHOT_STORE_URI"
DATABASE_ENV = "TP_DATABASE_URL"
# Where jobs that share no disk with the Dagster side hand over their run's files (runs/remote_files.py).
RUN_STORE_ENV = "TP_RUN_STORE_URI"
_PARENT = Path(__file__).resolve().parent.parent
SOURCE_CHECKOUT: Path | None = _PARENT if (_PARENT / "pyproject.toml").is_file() else None
"""The source tree this package runs from (an editable install); None when installed from a wheel.
What the platform needs at run time is in the package itself (training_platform/shipped/)."""


def database_url() -> str | None:
    """The platform's database (``$TP_DATABASE_URL``), shared by every machine of a team's deployment; None on
    the embedded default, where each part keeps its state in files of the home (training_platform/state/database.py)."""
    return os.environ.get(DATABASE_ENV) or None


@dataclass(frozen=True)
class PlatformHome:
    root: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PlatformHome:
        """The home ENVIRON names (this process's environment by default)."""
        return cls(Path(environ.get("TP_HOME", Path.cwd() / ".data")).resolve())

    @property
    def snapshots(self) -> Path | str:
        """Dataset snapshots: ``$TP_SNAPSHOT_STORE_URI`` (``s3://bucket/prefix``, where other machines read
        them too) when set, else a directory of the home."""
        store = os.environ.get(SNAPSHOT_STORE_ENV)
        if not store:
            return self.root / "snapshots"
        return store if "://" in store else Path(store)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def dagster_home(self) -> Path:
        return Path(os.environ.get("DAGSTER_HOME", self.root / "dagster"))

    @property
    def mlflow_tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{self.root / 'mlflow.db'}")

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def run_dir(self, run_id: str) -> Path:
        """The run's directory; a run id that is not one plain name under `runs/` is refused (SpecError)."""
        return contained(self.runs, check_run_id(run_id))

    def ensure(self) -> PlatformHome:
        for path in (self.snapshots, self.checkpoints, self.runs, self.dagster_home, self.mlflow_artifacts):
            if isinstance(path, Path):
                path.mkdir(parents=True, exist_ok=True)
        return self
