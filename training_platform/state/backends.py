"""Where a deployment's shared records and locks live: chosen here, above both backends.

The platform's database when ``TP_DATABASE_URL`` names one (documents_db.py: every machine of a team's deployment
reads the same rows), else JSON files of the platform home (documents.py, the embedded default).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from training_platform.paths import database_url
from training_platform.state.documents import Documents, FileDocuments


def open_documents(home_root: Path, kind: str, directory: str) -> Documents:
    """The deployment's records of `kind`: the platform's database when ``TP_DATABASE_URL`` names one, else the
    JSON files of `directory` under the home."""
    if url := database_url():
        from training_platform.state.documents_db import DatabaseDocuments  # SQLAlchemy only when asked for

        return DatabaseDocuments(url, kind, lock_dir=Path(home_root) / "locks")
    return FileDocuments(Path(home_root) / directory, kind)


def shared_lock(home_root: Path, kind: str, key: str) -> contextlib.AbstractContextManager[None]:
    """A lock on `key` (any text: a model's name) that every process of the deployment respects: a file lock in the
    home's `locks/`, or with ``TP_DATABASE_URL`` one the database holds for every machine."""
    name = f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return open_documents(home_root, kind, "locks").locked(name)
