"""Launchers: turn a run request into a plan, and a plan into a running job."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training_platform.launch.base import (
        PREEMPTED_EXIT_CODE,
        JobHandle,
        JobState,
        JobStatus,
        Launcher,
        LaunchPlan,
        RunRequest,
    )

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "JobHandle",
    "JobState",
    "JobStatus",
    "LaunchPlan",
    "Launcher",
    "RunRequest",
]


def __getattr__(name: str):
    # Imported on first use: the agent and the standby's requesters start from this package and
    # must not pay for pydantic and the spec (0.2 s) before they do anything.
    if name in __all__:
        from training_platform.launch import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
