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
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors

from builder.engine import leftovers
from builder.engine.daemon import docker_client
from builder.engine.ownership import OWNER_LABEL, Owner
from builder.engine.progress import Progress
from builder.engine.protocol import ContainerApi, Engine, StorageEngine
from builder.engine.reaper import DONE
from builder.errors import UserError


class SmokeHost:
    """The run's container API and owner. The API starts when the run asks for it (`start`, or the
    first `ready` or `client`): a run whose checks and SBOM are answered already (a no-op build)
    starts no service. Once it starts, what dead runs left there is swept beside the run's own work
    and a watchdog guards the run's containers and candidate tag; `ready()` waits for both."""

    def __init__(self, engine: Engine, progress: Progress, exits: contextlib.ExitStack) -> None:
        self.owner = Owner.current()
        self._engine, self._progress, self._exits = engine, progress, exits
        self._lock = threading.Lock()
        self._started: tuple[ContainerApi, Future] | None = None

    def start(self) -> tuple[ContainerApi, Future]:
        """The service started and the sweep begun, without waiting for either."""
        with self._lock:
            if self._started is None:
                api = self._exits.enter_context(self._engine.container_api())
                sweeper = self._exits.enter_context(ThreadPoolExecutor(1, thread_name_prefix="leftovers"))
                sweeping = sweeper.submit(_sweep_dead_runs, api, self._progress)
                self._exits.enter_context(watchdog(api.url, self.owner, api.service_pid, api.layout))
                self._started = api, sweeping
            return self._started

    def ready(self) -> ContainerApi:
        """The API once the sweep is done; raises what stopped the service or the sweep (podman that
        does not start, say)."""
        api, sweeping = self.start()
        sweeping.result()
        return api

    @property
    def client(self) -> docker.DockerClient:
        return self.ready().client

    def labels(self) -> dict[str, str]:
        return {OWNER_LABEL: self.owner.label()}


def _sweep_dead_runs(api: ContainerApi, progress: Progress) -> None:
    swept = leftovers.sweep(api.client, leftovers.of_dead_runs, api.layout)
    if swept:
        progress.stage(f"removed what earlier runs that died left: {swept.describe()}")


@contextlib.contextmanager
def open_host(engine: Engine, progress: Progress) -> Iterator[SmokeHost]:
    """The run's host; what it started (the service, the sweep, the watchdog) is stopped on leaving."""
    with contextlib.ExitStack() as exits:
        yield SmokeHost(engine, progress, exits)


@contextlib.contextmanager
def watchdog(url: str, owner: Owner, service_pid: int | None, layout: Path | None = None) -> Iterator[None]:
    """The reaper outlives this process; it acts only when we close its stdin without saying done."""
    argv = [sys.executable, "-m", "builder.engine.reaper", "--api", url, "--owner", owner.label()]
    if service_pid:
        argv += ["--service-pid", str(service_pid)]
    if layout is not None:
        argv += ["--layout", str(layout)]
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
def client_for(image: str, engine: StorageEngine) -> Iterator[docker.DockerClient | None]:
    """`builder smoke IMAGE`: the Docker daemon when it holds the image (a pulled image, a GPU host),
    else the container API of `engine` when it holds it (the CLI's: buildah, whose OCI layout is where
    `builder build` leaves images: imported into its storage first, only when the storage lacks it);
    None when neither does (smoke_gate then says the image is not found)."""
    try:
        client = docker_client()
        client.images.get(image)
        yield client
        return
    except (UserError, docker.errors.DockerException):
        pass
    if engine.holds(image):
        engine.ensure_in_storage(image)
        with engine.container_api() as api:
            yield api.client
        return
    yield None
