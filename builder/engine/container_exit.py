"""A container's exit status through the Docker API, asked for a few times a second.

The API's own wait is not used: podman before 4.5 (Debian bookworm has 4.3) answers it by looking at
the container's state every microsecond until it exits (podman PR 18149), which kept one of this
machine's two cores busy for the whole of every smoke run. Inspecting the container a few times a
second costs next to nothing on podman and on Docker alike. An inspect that meets the container's process
as it goes (podman 4.3: 500, "read /proc/PID/cgroup: no such process", seen in a cold CI run) is asked
again: the next one finds it stopped.
"""

from __future__ import annotations

import time

import docker.errors
from docker.models.containers import Container

POLL_S = 0.25
_DONE = ("exited", "dead")


def exit_status(container: Container, poll_s: float = POLL_S) -> int:
    """The started `container`'s exit code once it has stopped."""
    while True:
        try:
            container.reload()
        except docker.errors.APIError as error:
            if "no such process" not in str(error.explanation or ""):
                raise
            time.sleep(poll_s)
            continue
        state = container.attrs.get("State") or {}
        if state.get("Status") in _DONE:
            return int(state.get("ExitCode", -1))
        time.sleep(poll_s)
