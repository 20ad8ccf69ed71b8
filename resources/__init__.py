"""Dagster resources wrapping training_platform objects; backends are chosen by configuration."""

from resources.launcher import LauncherResource
from resources.platform import PlatformResource

__all__ = ["LauncherResource", "PlatformResource"]
