"""Failures of the in-image entrypoint, each with the exit status it documents.

One exception class per exit status, so a caller (docker, an orchestrator,
CI) can tell "fix your docker run line" from "the host is not ready" from
"the server broke" without reading the log. docs/entrypoint.md lists them.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REGRESSION = 1  # bench measured below the pinned figure beyond the tolerance
EXIT_SIGNAL_BASE = 128  # stopped by signal N: 128 + N, as a shell reports it


class EntrypointError(Exception):
    """A failure reported as one line (plus the log tail, where there is one)."""

    exit_code = 1

    def __init__(self, message: str, log_tail: tuple[str, ...] = (), log_path: str | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.log_path = log_path


class UsageError(EntrypointError):
    """Bad arguments or an unreadable stack description."""

    exit_code = 2


class PreflightError(EntrypointError):
    """The host is not ready: too few GPUs, model path unreadable, port taken."""

    exit_code = 3


class StartupFailed(EntrypointError):
    """The server printed a Traceback or exited before it was ready."""

    exit_code = 4


class StartupStalled(EntrypointError):
    """The server made no progress for the stall timeout, or hit the total cap."""

    exit_code = 5


class ServerDied(EntrypointError):
    """The server exited on its own after it had become ready."""

    exit_code = 6


class BenchFailed(EntrypointError):
    """The benchmark client could not complete its requests."""

    exit_code = 7


class Unhealthy(EntrypointError):
    """`health`: the server's /health did not answer 200 (a container health check's "unhealthy")."""

    exit_code = 1
