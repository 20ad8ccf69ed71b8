"""The lifecycle settings of a platform home: `$TP_HOME/checkpoint-lifecycle.yaml` (optional).

    grace_hours: 1            # chunks younger than this are never collected (saves in flight)
    tier_after_days: 7        # checkpoints saved longer ago move to the store's cold tier
    keep_hot_last: 1          # ... except each run's newest N (registered models' stay hot too)
    cold_tiers:               # store -> its cold tier; "default" is the home's own store
      default: /mnt/archive/tp-checkpoints
      s3://ml-ckpts/prod: s3://ml-ckpts/cold?storage_class=GLACIER_IR

A store with no cold tier is only collected. `TP_CHECKPOINT_LIFECYCLE` names another file.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from training_platform.errors import SpecError

SETTINGS_FILE = "checkpoint-lifecycle.yaml"
SETTINGS_ENV = "TP_CHECKPOINT_LIFECYCLE"
DEFAULT_STORE = "default"


class LifecycleSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_hours: float = Field(
        1.0, ge=0, le=24 * 30, description="hours an unreferenced chunk is kept: it may belong to a save in flight"
    )
    tier_after_days: float = Field(7.0, gt=0, description="days after which a checkpoint moves to the cold tier")
    keep_hot_last: int = Field(1, ge=0, description="each run's newest N checkpoints stay hot whatever their age")
    cold_tiers: dict[str, str] = Field(
        default_factory=dict, description="store URI (or 'default') -> cold tier URI (a directory or s3://)"
    )

    @field_validator("cold_tiers")
    @classmethod
    def _one_store_per_cold_tier(cls, tiers: dict[str, str]) -> dict[str, str]:
        for uri in tiers.values():
            if "://" in uri and not uri.startswith(("s3://", "file://")):
                raise ValueError(f"unsupported cold tier {uri!r}; use a local directory or s3://bucket/prefix")
        shared = {uri for uri in tiers.values() if list(tiers.values()).count(uri) > 1}
        if shared:
            raise ValueError(f"cold tier {sorted(shared)[0]} is named for two stores; give each store its own")
        return tiers

    def cold_tier_by_store(self, default_store_uri: str) -> dict[str, str]:
        """Store URI as its storage names itself (a resolved path, s3://bucket/prefix) -> cold tier URI."""
        from training_platform.checkpoints.store import open_storage

        return {
            open_storage(default_store_uri if store == DEFAULT_STORE else store).uri: cold
            for store, cold in self.cold_tiers.items()
        }


def settings_path(home_root: Path) -> Path:
    return Path(os.environ.get(SETTINGS_ENV) or Path(home_root) / SETTINGS_FILE)


def load_settings(home_root: Path) -> LifecycleSettings:
    """The home's settings; the defaults when it has no file."""
    path = settings_path(home_root)
    if not path.is_file():
        if os.environ.get(SETTINGS_ENV):
            raise SpecError(f"{SETTINGS_ENV}={path} does not exist; point it at a lifecycle settings file or unset it")
        return LifecycleSettings()
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc.__class__.__name__}); fix the syntax") from None
    try:
        return LifecycleSettings.model_validate(data if data is not None else {})
    except ValidationError as exc:
        from training_platform.spec import format_validation_error

        raise SpecError(format_validation_error(exc, LifecycleSettings, str(path))) from None
