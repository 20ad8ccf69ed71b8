"""Errors a user can act on. The CLI prints their message as one line and exits non-zero."""


class PlatformError(Exception):
    """Base class: the message names the problem and the fix."""

    exit_code = 1


class SpecError(PlatformError):
    """The spec (or the environment it names) is invalid; nothing was launched."""

    exit_code = 2


class RightsError(PlatformError):
    """The user may not do this (the message names the user, what they asked and who can change it); nothing was
    changed."""

    exit_code = 2


class SnapshotError(PlatformError):
    """A dataset snapshot is missing or does not verify."""

    exit_code = 2


class CheckpointError(PlatformError):
    """A checkpoint could not be written or restored."""


class LaunchError(PlatformError):
    """A backend refused or failed a submission."""


class SharedStateError(PlatformError):
    """The platform's shared state (the run registry, the queues of sweeps and runs waiting for their window)
    could not be read or written: its database is down or refused the request."""
