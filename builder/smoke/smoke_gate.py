"""Run the in-image smoke checks in a container and collect their report.

The program is the module builder.runtime.smoke, copied into every image at
/opt/builder/runtime/; here it runs through the Docker SDK, with the GPUs
passed in when asked (`--gpus all` is a DeviceRequest for every GPU). The image
is one the container API holds, named, or one of the builder's layout, run on
a root assembled from its layers (engine/image_container.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import docker
import docker.errors
from docker.types import DeviceRequest

from builder.engine.container_exit import exit_status
from builder.engine.daemon import docker_client
from builder.engine.image_container import ContainerRequest, ImageSource, as_source
from builder.errors import BuildFailure, UserError
from builder.lock.smoke_report import SmokeReport
from builder.paths import TOOLS_DIR, VENV_PYTHON
from builder.runtime.smoke import report as smoke_report
from builder.smoke import read_tracer
SMOKE_COMMAND = [VENV_PYTHON, "-m", "builder.runtime.smoke", "--json"]
# The in-image tools are the package builder.runtime under TOOLS_DIR's parent (/opt).
SMOKE_ENVIRONMENT = {"PYTHONPATH": os.path.dirname(TOOLS_DIR)}


def device_requests(gpus: str | None) -> list[DeviceRequest]:
    """`--gpus all` / `--gpus N` as the Docker API's device request; none without --gpus."""
    if gpus is None:
        return []
    if gpus == "all":
        count = -1
    elif gpus.isdigit() and int(gpus) > 0:
        count = int(gpus)
    else:
        raise UserError(f"--gpus takes 'all' or a positive number, not {gpus!r}")
    return [DeviceRequest(count=count, capabilities=[["gpu"]])]


def run_in_image(image: str | ImageSource, gpus: str | None = None, only: list[str] | None = None,
                 client: docker.DockerClient | None = None, labels: dict[str, str] | None = None) -> SmokeReport:
    """Run the checks in a fresh container of `image` and collect their report. `labels` mark the
    container as a run's, so what a run that died left can be found (engine/leftovers.py)."""
    source = as_source(image)
    run = _run_container(source, only, gpus, client or _client(), labels or {}, traced=False)
    return SmokeReport(source.name, run.stack, tuple(run.results))


@dataclass(frozen=True)
class CheckRun:
    stack: str
    results: list[smoke_report.Result]
    traces: list[str]  # the read tracer's files, one per process (empty when not traced)


def run_traced(image: str | ImageSource, check: str, client: docker.DockerClient,
               labels: dict[str, str]) -> CheckRun:
    """One check (a group of the smoke program) in a container of its own, under the read tracer."""
    return _run_container(as_source(image), [check], None, client, labels, traced=True)


def _client() -> docker.DockerClient:
    try:
        return docker_client()
    except docker.errors.DockerException as error:
        raise UserError(f"cannot reach the Docker daemon: {_first_line(error)}") from None


def _run_container(image: ImageSource, only: list[str] | None, gpus: str | None, client: docker.DockerClient,
                   labels: dict[str, str], traced: bool) -> CheckRun:
    command = SMOKE_COMMAND + (["--only", *only] if only else [])
    environment = dict(SMOKE_ENVIRONMENT)
    if traced:
        environment.update(read_tracer.environment(SMOKE_ENVIRONMENT["PYTHONPATH"]))
    # The program as the entrypoint itself: podman's API reads an empty entrypoint as "the image's".
    # No check reaches the network; the GPU checks keep the engine's, which NCCL's rendezvous ran on.
    request = ContainerRequest(tuple(command[1:]), tuple(command[:1]), environment, labels,
                               tuple(device_requests(gpus)), network_disabled=gpus is None)
    traces: list[str] = []
    try:
        with image.container(client, request) as container:
            if traced:
                container.put_archive(read_tracer.PARENT, read_tracer.archive())
            container.start()
            status = exit_status(container)
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            if traced:
                stream, _ = container.get_archive(read_tracer.OUT)
                traces = read_tracer.traces(b"".join(stream))
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image.name} not found") from None
    except docker.errors.APIError as error:
        raise BuildFailure(f"smoke checks could not run in {image.name}: {_first_line(error)}") from None
    except docker.errors.DockerException as error:
        raise UserError(f"cannot reach the Docker daemon: {_first_line(error)}") from None
    try:
        stack, results = smoke_report.from_json(stdout)
    except (ValueError, KeyError, TypeError):
        tail = (stderr.strip().splitlines() or [f"exit status {status}, no output"])[-1]
        raise BuildFailure(f"smoke checks in {image.name} gave no report: {tail}") from None
    return CheckRun(stack, results, traces)


def smoke(image: str, gpus: str | None, json_path: str | None, only: list[str] | None = None,
          client: docker.DockerClient | None = None) -> int:
    """Print the table, write the JSON report if asked; 1 when any check failed."""
    report = run_in_image(image, gpus, only, client)
    print(report.table(), end="")
    if json_path:
        try:
            with open(json_path, "w", encoding="utf-8") as handle:
                handle.write(smoke_report.to_json(report.stack, list(report.results)))
        except OSError as error:
            raise UserError(f"cannot write {json_path}: {error.strerror}") from None
    if not report.passed:
        raise BuildFailure(f"smoke checks failed in {image}: {', '.join(report.failures())}")
    return 0


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
