"""The checkpoint stores a platform home uses: its own, those its runs named, those the settings name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from training_platform.checkpoints.store import open_storage
from training_platform.errors import CheckpointError
from training_platform.identifiers import contained
from training_platform.lifecycle.settings import DEFAULT_STORE, LifecycleSettings
from training_platform.paths import PlatformHome
from training_platform.runs.attempts import RECORD_FILE
from training_platform.runs.backends import open_run_registry

log = logging.getLogger(__name__)


def home_store_uris(home: PlatformHome, settings: LifecycleSettings, default_uri: str | None = None) -> list[str]:
    """Every store URI, the home's default first, each once (as its storage names itself).

    `default_uri`: the deployment's default store (the platform resource's), else the home's directory.
    """
    uris = [default_uri or str(home.checkpoints)]
    uris += [uri for uri in settings.cold_tiers if uri != DEFAULT_STORE]
    for record in sorted(home.runs.glob(f"*/{RECORD_FILE}")) if home.runs.is_dir() else []:
        uris += _named(_read(record), ("store_uri",))
    for spec in open_run_registry(home).specs().values():
        uris += _named(spec, ("checkpoint", "store_uri"))
    seen: dict[str, str] = {}
    for uri in uris:
        seen.setdefault(_canonical(uri), uri)
    return list(seen.values())


def run_store_uri(home: PlatformHome, run_id: str) -> str:
    """The store the run saved to: the one its last attempt recorded, else its spec's, else the home's own (where
    a worker saves when its spec names none)."""
    named = _named(_read(contained(home.runs, run_id, RECORD_FILE)), ("store_uri",))
    named = named or _named(open_run_registry(home).get(run_id), ("checkpoint", "store_uri"))
    return named[0] if named else str(home.checkpoints)


def _named(text: str | None, path: tuple[str, ...]) -> list[str]:
    """The store a run's attempt record or spec names (read as plain JSON: a spec that no longer validates
    still names where its checkpoints are)."""
    try:
        node = json.loads(text or "")
        for part in path:
            node = node[part]
    except (ValueError, KeyError, TypeError):
        return []
    return [node] if isinstance(node, str) and node else []


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # removed while we listed
        return None


def _canonical(uri: str) -> str:
    try:
        return open_storage(uri).uri
    except (CheckpointError, ValueError) as exc:  # reported again by its own collection
        log.warning("store %s: %s", uri, exc)
        return uri
