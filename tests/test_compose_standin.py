"""The built CUDA 13 image (the README's default row) served through its rendered compose file, as a GPU host runs it, with
tests/compose/standin.override.yaml in place of the GPUs: pytest-docker's docker_services brings the
`baseline` profile up (Docker Compose v2), the test waits until the Docker daemon reports the
entrypoint's own health check healthy, runs `bench` against the server, and docker_services tears the
project down (`down --volumes`)."""

from __future__ import annotations

import json
import os
import resource
import urllib.request
from types import SimpleNamespace

import docker
import pytest

from builder.paths import RUNTIME_UID
from checkouts import BUILT_STACK as STACK, REPO
from compose_tools import compose_command
from registries import free_port

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.slow]

RENDERED = REPO / "images" / STACK / "compose.yaml"
OVERRIDE = REPO / "tests" / "compose" / "standin.override.yaml"
SERVICE = "baseline"
PROJECT = f"builder-compose-test-{os.getpid()}"
ENTRYPOINT = ["/opt/venv/bin/python", "-m", "builder.runtime.serve.entrypoint"]


@pytest.fixture(scope="module")
def compose_host(tmp_path_factory) -> SimpleNamespace:
    """The host side the compose file's variables point at: a model folder, a cache, a free port, the
    memlock limit the daemon may grant; and the env file compose reads them from."""
    root = tmp_path_factory.mktemp("compose-host")
    (root / "models" / "model").mkdir(parents=True)
    (root / "models" / "model" / "config.json").write_text("{}")
    (root / "cache").mkdir()
    os.chown(root / "cache", RUNTIME_UID, RUNTIME_UID)  # the image's user writes the cache, as on a GPU host
    _, memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return SimpleNamespace(root=root, cache=root / "cache", port=free_port(), env_file=root / "compose.env",
                           memlock=-1 if memlock == resource.RLIM_INFINITY else memlock)


# pytest-docker's fixtures (per module: pyproject's --container-scope), pointed at the rendered file and
# the override.
@pytest.fixture(scope="module")
def docker_compose_command(compose_host) -> str:
    return compose_command(compose_host.env_file, {
        "COMPOSE_PROFILES": SERVICE,
        "SERVE_MODELS_DIR": compose_host.root / "models",
        "SERVE_CACHE_DIR": compose_host.cache,
        "SERVE_PORT": compose_host.port,
        "STANDIN_DIR": REPO / "tests" / "standin_sglang",
        "STANDIN_MEMLOCK": compose_host.memlock,
    })


@pytest.fixture(scope="module")
def docker_compose_file(built) -> list[str]:
    """`built` first: the image the rendered file names must exist before `up`."""
    return [str(RENDERED), str(OVERRIDE)]


@pytest.fixture(scope="module")
def docker_compose_project_name() -> str:
    return PROJECT


@pytest.fixture(scope="module")
def docker_cleanup() -> list[str]:
    return ["down --volumes --timeout 30"]


def service_container(client: docker.DockerClient):
    found = client.containers.list(all=True, filters={"label": [f"com.docker.compose.project={PROJECT}",
                                                                f"com.docker.compose.service={SERVICE}"]})
    assert len(found) == 1, found
    return found[0]


def healthy(container) -> bool:
    """The daemon's verdict from the health check; a container that stopped fails the test at once."""
    container.reload()
    state = container.attrs["State"]
    if state["Status"] != "running":
        raise AssertionError(f"{SERVICE} is {state['Status']} (exit {state['ExitCode']}):\n"
                             + container.logs().decode()[-3000:])
    return state["Health"]["Status"] == "healthy"


def test_rendered_compose_file_serves_the_built_image_healthy_and_bench_runs_against_it(
        built, compose_down_guard, docker_services, compose_host):
    _, build_report = built
    container = service_container(docker.from_env())
    assert container.image.id == build_report["image_id"]  # the file names the image this tree builds

    docker_services.wait_until_responsive(check=lambda: healthy(container), timeout=120, pause=0.5)
    last = container.attrs["State"]["Health"]["Log"][-1]
    assert last["ExitCode"] == 0
    assert last["Output"] == "healthy: GET http://127.0.0.1:30000/health answered 200\n"
    logs = container.logs().decode()
    assert "The server is fired up and ready to roll!" in logs and "server ready after" in logs
    assert "pre-flight passed: 8 GPU(s), 8 needed" in logs

    # The published port, as a client on the GPU host reaches the server.
    assert docker_services.port_for(SERVICE, 30000) == compose_host.port
    with urllib.request.urlopen(f"http://127.0.0.1:{compose_host.port}/health", timeout=10) as response:
        assert response.status == 200

    # The compose file's own bench line: the entrypoint inside the serving container, against it.
    bench = container.exec_run([*ENTRYPOINT, "bench", "--mode", SERVICE, "--url", "http://127.0.0.1:30000",
                                "--warmup", "1", "--repetitions", "2", "--output-len", "32"])
    output = bench.output.decode()
    assert bench.exit_code == 0, output
    report = json.loads((compose_host.cache / "bench" / f"{STACK}-{SERVICE}.json").read_text())  # the cache mount
    assert report["stack"] == STACK and report["mode"] == SERVICE and report["url"] == "http://127.0.0.1:30000"
    # No figure is pinned for this row or a row it replaces (bench/reference.toml): reported, not judged.
    assert report["reference_tok_s"] is None and report["verdict"] == "unpinned", output
    assert report["metrics"]["output_tok_s"]["n"] == 2
    # The settings the compose file gives the container, as the daemon applied them.
    host_config = container.attrs["HostConfig"]
    assert host_config["IpcMode"] == "host"
    assert {u["Name"]: u["Hard"] for u in host_config["Ulimits"]} == {"memlock": compose_host.memlock,
                                                                       "stack": 67108864}
    assert container.attrs["Config"]["StopTimeout"] == 90
