"""Where one `builder build` run smoke-tests its candidates, and its guard against leaving them behind.

The checks run where the image already is: the engine's own container API (Engine.container_api: for
buildah, podman's Docker API over its storage, so nothing is copied into the Docker daemon; for the docker
engine, the daemon that built the image). Either way the run first sweeps what dead runs of this host
left there (engine/leftovers.py), and a watchdog (engine/reaper.py) removes the run's own containers
and candidate tags if it dies before it is done.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import docker.errors

from builder.engine import leftovers
from builder.engine.daemon import docker_client
from builder.engine.ownership import OWNER_LABEL, Owner
from builder.engine.progress import Progress
from builder.engine.protocol import Engine
from builder.engine.reaper import DONE
from builder.errors import UserError


@dataclass(frozen=True)
class SmokeHost:
    client: docker.DockerClient
    owner: Owner

    def labels(self) -> dict[str, str]:
        return {OWNER_LABEL: self.owner.label()}


@contextlib.contextmanager
def open_host(engine: Engine, progress: Progress) -> Iterator[SmokeHost]:
    owner = Owner.current()
    with engine.container_api() as api:
        swept = leftovers.sweep(api.client, leftovers.of_dead_runs)
        if swept:
            progress.stage(f"removed what earlier runs that died left: {swept.describe()}")
        with watchdog(api.url, owner, api.service_pid):
            yield SmokeHost(api.client, owner)


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
def client_for(image: str, engine: Engine) -> Iterator[docker.DockerClient | None]:
    """`builder smoke IMAGE`: the Docker daemon when it holds the image (a pulled image, a GPU host),
    else the container API of `engine` when its storage holds it (the CLI's: buildah's storage, where
    `builder build` leaves images); None when neither does (smoke_gate then says the image is not found)."""
    try:
        client = docker_client()
        client.images.get(image)
        yield client
        return
    except (UserError, docker.errors.DockerException):
        pass
    if engine.holds(image):
        with engine.container_api() as api:
            yield api.client
        return
    yield None
