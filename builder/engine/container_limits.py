"""The limits a container is given: this process's own, so it starts on any host."""

from __future__ import annotations

import resource
from pathlib import Path

from docker.types import Ulimit


def own_ulimits() -> list[Ulimit]:
    """This process's own open-file and process limits, so the container starts on any host: podman's
    defaults (nofile 1048576) exceed some hosts' hard limits, and runc cannot raise a limit. podman
    also lowers its own process limit to the kernel's pid_max, so nproc stays under that too."""
    return [Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in _own_limits()]


def runtime_rlimits() -> list[dict]:
    """The same limits in an OCI runtime spec's form, for the build steps the builder runs with runc."""
    return [{"type": f"RLIMIT_{name.upper()}", "soft": soft, "hard": hard} for name, soft, hard in _own_limits()]


def _own_limits() -> list[tuple[str, int, int]]:
    limits = []
    for name, which, cap in (("nofile", resource.RLIMIT_NOFILE, None), ("nproc", resource.RLIMIT_NPROC, _pid_max())):
        soft, hard = (_capped(value, cap) for value in resource.getrlimit(which))
        if soft is not None and hard is not None:
            limits.append((name, soft, hard))
    return limits


def _capped(value: int, cap: int | None) -> int | None:
    """None for unlimited with no cap: the engine's default then."""
    if value == resource.RLIM_INFINITY:
        return cap
    return value if cap is None else min(value, cap)


def _pid_max() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return None
