"""The watchdog of one `builder` run: `python -m builder.engine.reaper --api URL --owner HOST:PID`.

The run starts it in a session of its own and holds the write end of its stdin. A run that ends
normally writes "done" before closing it; a run that dies (even by SIGKILL) closes it with nothing
written, and then the watchdog removes the run's smoke containers and candidate tags through the
Docker API at URL and among the refs of the builder's OCI layout (--layout), and stops the podman
service the run started (--service-pid), so nothing of the run keeps going without it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

DONE = b"done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="builder.engine.reaper")
    parser.add_argument("--api", required=True, help="the Docker API the run's containers live behind")
    parser.add_argument("--owner", required=True, help="HOST:PID of the run")
    parser.add_argument("--service-pid", type=int, help="the podman service the run started")
    parser.add_argument("--layout", type=Path, help="the OCI layout whose refs name the images the builder wrote")
    args = parser.parse_args(argv)
    said = sys.stdin.buffer.read()  # returns at EOF: when the run closes it or dies
    if said.strip() == DONE:
        return 0  # the run cleaned up and stops its own service
    try:
        _sweep(args.api, args.owner, args.layout)
    finally:
        if args.service_pid:
            stop(args.service_pid)
            _remove_socket(args.api)
    return 0


def _remove_socket(api: str) -> None:
    """The dead run's socket and the service's log beside it (engine/podman_service.py names both)."""
    socket = Path(api.removeprefix("unix://"))
    for path in (socket, socket.with_suffix(".log")):
        path.unlink(missing_ok=True)


def _sweep(api: str, owner_label: str, layout: Path | None) -> None:
    import docker  # only a dying run needs the SDK

    from builder.engine.leftovers import Swept, sweep, sweep_refs
    from builder.engine.ownership import Owner

    owner = Owner.from_label(owner_label)
    # The layout's refs first: they need no API, which the run's dead podman service may not answer.
    refs = sweep_refs(layout, lambda found: found == owner) if layout is not None else []
    try:
        swept = sweep(docker.DockerClient(base_url=api, timeout=120), lambda found: found == owner)
    except Exception as error:  # noqa: BLE001 - the service must still be stopped; say why nothing was swept
        print(f"reaper: could not sweep {owner_label} at {api}: {error}", file=sys.stderr)
        swept = Swept()
    swept = Swept(swept.containers, tuple(sorted({*swept.tags, *refs})))
    if swept:
        print(f"reaper: removed what run {owner_label} left: {swept.describe()}", file=sys.stderr)


def stop(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after the grace period; a process already gone is fine."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _running(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # our child only when we started it
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


if __name__ == "__main__":
    sys.exit(main())
