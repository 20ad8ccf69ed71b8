"""Launchers: turn a run request into a plan, and a plan into a running job."""

from training_platform.launch.base import (
    PREEMPTED_EXIT_CODE,
    PREEMPTED_MARKER,
    JobHandle,
    JobState,
    JobStatus,
    Launcher,
    LaunchPlan,
    RunRequest,
)

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "PREEMPTED_MARKER",
    "JobHandle",
    "JobState",
    "JobStatus",
    "LaunchPlan",
    "Launcher",
    "RunRequest",
]
