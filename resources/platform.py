"""Where the platform's state lives, as a Dagster resource."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from training_platform.paths import PlatformHome

CHECKPOINT_STORE_ENV = "TP_CHECKPOINT_STORE_URI"


class PlatformResource(dg.ConfigurableResource):
    """The project data directory (snapshots, runs, checkpoints) and the MLflow tracking URI."""

    home: str | None = Field(None, description="project data directory; default $TP_HOME or ./.data")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI or SQLite in the data directory"
    )
    checkpoint_store_uri: str | None = Field(
        None,
        description="default checkpoint store (local path or s3://bucket/prefix) for specs that name none; "
        f"default ${CHECKPOINT_STORE_ENV} or the home's checkpoints/",
    )

    def paths(self) -> PlatformHome:
        home = PlatformHome.from_env() if self.home is None else PlatformHome(Path(self.home).expanduser().resolve())
        return home.ensure()

    def mlflow_uri(self) -> str:
        return self.tracking_uri or self.paths().mlflow_tracking_uri

    def store_uri_for(self, spec_store_uri: str | None) -> str:
        return (
            spec_store_uri
            or self.checkpoint_store_uri
            or os.environ.get(CHECKPOINT_STORE_ENV)
            or str(self.paths().checkpoints)
        )
