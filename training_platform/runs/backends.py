"""Where a deployment's run registry lives: chosen here, above both backends.

The platform's database when ``TP_DATABASE_URL`` names one (registry_db.py: every machine of a team's deployment
reads the same rows), else a file per run in the platform home (registry.py, the embedded default).
"""

from __future__ import annotations

from training_platform.paths import PlatformHome, database_url
from training_platform.runs.registry import FileRunRegistry, RunRegistry


def open_run_registry(home: PlatformHome) -> RunRegistry:
    """The deployment's registry: the platform's database when ``TP_DATABASE_URL`` names one, else the home."""
    if url := database_url():
        from training_platform.runs.registry_db import DatabaseRunRegistry  # SQLAlchemy only when asked for

        return DatabaseRunRegistry(url)
    return FileRunRegistry(home)
