"""podman's Docker-compatible API over buildah's own storage: where the smoke checks run a buildah
image without copying it anywhere (docs/engines.md says why this and not a copy into Docker).

`podman system service` serves the storage buildah builds into (the same --root/--runroot, or the
same storage.conf, CONTAINERS_STORAGE_CONF included) on a unix socket of this run's own, for as long
as the run needs it. It is started in a session of its own, so a Ctrl-C meant for the build does not
kill it before the build has cleaned up; the run's watchdog (engine/reaper.py) stops it if the run dies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

from builder.engine.reaper import stop
from builder.errors import UserError

INSTALL_HINT = "install it with scripts/setup-host (or apt-get install podman)"
START_TIMEOUT_S = 60
RUNROOT_MAX = 50


class Service:
    """A started service: `client()` waits until it answers (once), so the caller's own work overlaps
    podman's start-up, and a run that never runs a container never waits for it."""

    def __init__(self, url: str, process: subprocess.Popen, log: Path) -> None:
        self.url, self.pid = url, process.pid  # url: unix:///run/builder/podman-PID.sock
        self._process, self._log = process, log
        self._client: docker.DockerClient | None = None
        self._waiting = threading.Lock()

    def client(self) -> docker.DockerClient:
        with self._waiting:
            if self._client is None:
                self._client = _wait_for(self._process, self.url, self._log)
            return self._client


def storage_args(storage_dir: Path | None) -> list[str]:
    """podman's flags for the storage a BuildahEngine with this storage_dir builds into."""
    if storage_dir is None:
        return []
    return ["--root", str(storage_dir / "root"), "--runroot", str(_short_path(storage_dir / "run")),
            "--storage-driver", "overlay"]


def _short_path(runroot: Path) -> Path:
    """podman refuses a runroot longer than 50 characters (and a link to one), and it must share
    buildah's, whose locks and mount counts live there."""
    if len(str(runroot)) > RUNROOT_MAX:
        raise UserError(f"private storage {runroot.parent} is too deep for podman (its runroot {runroot} is over "
                        f"{RUNROOT_MAX} characters): use a shorter path")
    return runroot


def run_dir() -> Path:
    """Sockets live here: /run/builder for root, else the temporary directory."""
    preferred = Path("/run/builder")
    try:
        preferred.mkdir(mode=0o700, exist_ok=True)
        return preferred
    except OSError:
        return Path(tempfile.gettempdir())


@contextlib.contextmanager
def serve(storage_dir: Path | None) -> Iterator[Service]:
    """A podman service over that storage, on this run's own socket, stopped on the way out."""
    if shutil.which("podman") is None:
        raise UserError(f"podman not found (the smoke checks run buildah's images through it): {INSTALL_HINT}")
    socket = run_dir() / f"podman-{os.getpid()}.sock"
    log = socket.with_suffix(".log")
    socket.unlink(missing_ok=True)
    url = f"unix://{socket}"
    with log.open("wb") as log_stream:
        process = subprocess.Popen(
            ["podman", *storage_args(storage_dir), "system", "service", "--time=0", url],
            stdin=subprocess.DEVNULL, stdout=log_stream, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield Service(url, process, log)
    finally:
        stop(process.pid)
        with contextlib.suppress(ChildProcessError):
            process.wait(timeout=5)
        socket.unlink(missing_ok=True)
        log.unlink(missing_ok=True)


def _wait_for(process: subprocess.Popen, url: str, log: Path) -> docker.DockerClient:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            tail = (log.read_text(errors="replace").strip().splitlines() or [f"exit status {process.returncode}"])
            raise UserError(f"podman system service did not start: {tail[-1]}")
        try:
            client = docker.DockerClient(base_url=url, timeout=600)
            client.ping()
            return client
        except (docker.errors.DockerException, OSError):
            if time.monotonic() > deadline:
                raise UserError(f"podman system service did not answer on {url} within {START_TIMEOUT_S} s") from None
            time.sleep(0.1)
