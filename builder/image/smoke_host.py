"""Where one `builder build` run smoke-tests its candidates, and its guard against leaving them behind.

With buildah the checks run where the image already is: podman's Docker API over buildah's storage
(engine/podman_service.py), so nothing is copied into the Docker daemon. With the docker engine they
run in the daemon that built the image. Either way the run first sweeps what dead runs of this host
left there (engine/leftovers.py), and a watchdog (engine/reaper.py) removes the run's own containers
and candidate tags if it dies before it is done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import docker.errors

from builder.engine import leftovers, podman_service
from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import docker_client
from builder.engine.ownership import OWNER_LABEL, Owner
from builder.engine.progress import Progress
from builder.engine.reaper import DONE
from builder.errors import UserError

DOCKER_DEFAULT_URL = "unix:///var/run/docker.sock"


@dataclass(frozen=True)
class SmokeHost:
    client: docker.DockerClient
    owner: Owner

    def labels(self) -> dict[str, str]:
        return {OWNER_LABEL: self.owner.label()}


@contextlib.contextmanager
def open_host(engine, progress: Progress) -> Iterator[SmokeHost]:
    owner = Owner.current()
    with _api(engine) as (client, url, service_pid):
        swept = leftovers.sweep(client, leftovers.of_dead_runs)
        if swept:
            progress.stage(f"removed what earlier runs that died left: {swept.describe()}")
        with watchdog(url, owner, service_pid):
            yield SmokeHost(client, owner)


@contextlib.contextmanager
def _api(engine) -> Iterator[tuple[docker.DockerClient, str, int | None]]:
    if engine.name == "buildah":
        with podman_service.serve(engine.storage_dir) as service:
            yield service.client, service.url, service.pid
    else:
        yield docker_client(), os.environ.get("DOCKER_HOST", DOCKER_DEFAULT_URL), None


@contextlib.contextmanager
def watchdog(url: str, owner: Owner, service_pid: int | None) -> Iterator[None]:
    """The reaper outlives this process; it acts only when we close its stdin without saying done."""
    argv = [sys.executable, "-m", "builder.engine.reaper", "--api", url, "--owner", owner.label()]
    if service_pid:
        argv += ["--service-pid", str(service_pid)]
    reaper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield
    finally:
        assert reaper.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            reaper.stdin.write(DONE)
            reaper.stdin.close()
        reaper.wait()


@contextlib.contextmanager
def client_for(image: str) -> Iterator[docker.DockerClient | None]:
    """`builder smoke IMAGE`: the Docker daemon when it holds the image (a pulled image, a GPU host),
    else podman's API over buildah's storage when that holds it (what `builder build` leaves); None
    when neither does (smoke_gate then says the image is not found)."""
    try:
        client = docker_client()
        client.images.get(image)
        yield client
        return
    except (UserError, docker.errors.DockerException):
        pass
    if shutil.which("buildah") and BuildahEngine(export_to_docker=False).exists(image):
        with podman_service.serve(None) as service:
            yield service.client
        return
    yield None
