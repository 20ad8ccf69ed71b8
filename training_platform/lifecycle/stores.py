"""The checkpoint stores a platform home uses: its own, those its runs named, those the settings name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from training_platform.attempts import RECORD_FILE
from training_platform.checkpoints.store import open_storage
from training_platform.errors import CheckpointError
from training_platform.lifecycle.settings import DEFAULT_STORE, LifecycleSettings
from training_platform.paths import PlatformHome
from training_platform.runs import SUBMITTED_SPEC

log = logging.getLogger(__name__)


def home_store_uris(home: PlatformHome, settings: LifecycleSettings, default_uri: str | None = None) -> list[str]:
    """Every store URI, the home's default first, each once (as its storage names itself).

    `default_uri`: the deployment's default store (the platform resource's), else the home's directory.
    """
    uris = [default_uri or str(home.checkpoints)]
    uris += [uri for uri in settings.cold_tiers if uri != DEFAULT_STORE]
    for run_dir in sorted(home.runs.glob("*")) if home.runs.is_dir() else []:
        uris += _named_by_run(run_dir)
    seen: dict[str, str] = {}
    for uri in uris:
        seen.setdefault(_canonical(uri), uri)
    return list(seen.values())


def _named_by_run(run_dir: Path) -> list[str]:
    """The store a run's record or submitted spec names (read as plain JSON: a spec that no longer
    validates still names where its checkpoints are)."""
    named = []
    for name, path in ((RECORD_FILE, ("store_uri",)), (SUBMITTED_SPEC, ("checkpoint", "store_uri"))):
        try:
            node = json.loads((run_dir / name).read_text())
            for part in path:
                node = node[part]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(node, str) and node:
            named.append(node)
    return named


def _canonical(uri: str) -> str:
    try:
        return open_storage(uri).uri
    except (CheckpointError, ValueError) as exc:  # reported again by its own collection
        log.warning("store %s: %s", uri, exc)
        return uri
