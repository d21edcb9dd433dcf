"""Push and pull by digest against a real registry (Debian's docker-registry, i.e. Distribution)
started on loopback, through the real Docker daemon, with tiny images made here."""

from __future__ import annotations

import dataclasses
import http.server
import os
import threading
from pathlib import Path

import pytest

from builder.lock import records, store
from builder.lock.model import PushRecord
from builder.publish import registry
from builder.cli.main import main
from builder.errors import BuildFailure, UserError
from builder.config.matrix import load_matrix

from compose_tools import compose_command
from lock_values import smoke_report
from registries import Registry, free_port

REPO = Path(__file__).resolve().parent.parent
STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")

pytestmark = pytest.mark.engine


class Answers500:
    """Anything on this port answers HTTP 500: a registry that is up but failing."""

    def __init__(self, port: int):
        self.requests: list[str] = []
        recorded = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _fail(self):
                recorded.append(f"{self.command} {self.path}")
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _fail

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# The registry the push and pull tests share, a compose service (tests/compose/registry.yaml) that
# pytest-docker's docker_services starts once for this module and takes down after it; each test pushes
# an image of its own repository.
@pytest.fixture(scope="module")
def registry_server(tmp_path_factory) -> Registry:
    server = Registry(tmp_path_factory.mktemp("registry"), free_port())
    (server.root / "config.yml").write_text(server.config(seen_as=Path("/registry")))
    return server


@pytest.fixture(scope="module")
def docker_compose_command(registry_server, registry_container_image, tmp_path_factory) -> str:
    return compose_command(tmp_path_factory.mktemp("compose") / "registry.env", {
        "REGISTRY_IMAGE": registry_container_image, "REGISTRY_ROOT": registry_server.root,
        "REGISTRY_PORT": registry_server.port})


@pytest.fixture(scope="module")
def docker_compose_file() -> str:
    return str(REPO / "tests" / "compose" / "registry.yaml")


@pytest.fixture(scope="module")
def docker_compose_project_name() -> str:
    return f"builder-registry-test-{os.getpid()}"


@pytest.fixture(scope="module")
def docker_cleanup() -> list[str]:
    return ["down --volumes --timeout 10"]


@pytest.fixture
def live_registry(registry_server, compose_down_guard, docker_services) -> Registry:
    docker_services.wait_until_responsive(check=registry_server.responds, timeout=30, pause=0.1)
    return registry_server


class Sleeps:
    """Retry's sleep: records the delays, and can change the world between attempts."""

    def __init__(self, between=None):
        self.delays: list[float] = []
        self.between = between

    def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self.between:
            self.between(len(self.delays))


def test_push_then_pull_by_digest(client, live_registry, image, cu128_lock, capsys, record_cu128):
    record_cu128(cu128_lock, image)
    pushed = registry.push(STACK.name, live_registry.host, client=client, lock_path=cu128_lock)
    digest = live_registry.manifest_digest(image["repository"], "0.5.9-cu128-abc123")
    assert pushed.manifest_digest == digest
    outcome = store.entry(STACK.name, cu128_lock).outcome
    assert outcome.push == PushRecord(live_registry.host, image["repository"], "0.5.9-cu128-abc123", digest)
    assert outcome.push.reference == f"{live_registry.host}/{image['repository']}@{digest}"
    assert outcome.image.manifest_digest == digest

    client.images.remove(image["id"], force=True)  # the pull must come from the registry
    status = main(["pull", STACK.name])
    out = capsys.readouterr().out
    assert status == 0
    assert out == (f"{STACK.name}: {live_registry.host}/{image['repository']}@{digest} is {image['id']}, "
                   f"tagged {image['immutable']}\n")
    pulled = client.images.get(image["immutable"])
    assert pulled.id == image["id"]
    assert f"{live_registry.host}/{image['repository']}@{digest}" in pulled.attrs["RepoDigests"]


def test_push_command_prints_the_digest_reference(client, live_registry, image, cu128_lock, capsys, record_cu128):
    record_cu128(cu128_lock, image)
    assert main(["push", STACK.name, "--registry", f"{live_registry.host}/team"]) == 0
    digest = live_registry.manifest_digest(f"team/{image['repository']}", "0.5.9-cu128-abc123")
    assert capsys.readouterr().out == (
        f"{STACK.name}: pushed {live_registry.host}/team/{image['repository']}:0.5.9-cu128-abc123 = "
        f"{live_registry.host}/team/{image['repository']}@{digest}\n")


def test_an_immutable_tag_is_never_moved(client, live_registry, image, cu128_lock, record_cu128):
    record_cu128(cu128_lock, image)
    registry.push(STACK.name, live_registry.host, client=client, lock_path=cu128_lock)
    registry.push(STACK.name, live_registry.host, client=client, lock_path=cu128_lock)  # same image: fine
    # Another image under the same immutable tag.
    client.api.import_image_from_data(b"\0" * 1024, repository=image["repository"], tag="other")
    other_id = client.images.get(f"{image['repository']}:other").id
    try:
        record_cu128(cu128_lock, {**image, "id": other_id})
        before = cu128_lock.read_bytes()
        with pytest.raises(BuildFailure, match=rf"already names another image \({image['id']}\); immutable tags are never moved$"):
            registry.push(STACK.name, live_registry.host, client=client, lock_path=cu128_lock)
        assert cu128_lock.read_bytes() == before
    finally:
        client.images.remove(other_id, force=True)


def test_registry_down_is_retried_then_a_clear_error_with_the_lock_untouched(client, image, cu128_lock, record_cu128):
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    host = f"127.0.0.1:{free_port()}"
    sleeps = Sleeps()
    with pytest.raises(BuildFailure) as failure:
        registry.push(STACK.name, host, retry=registry.Retry(3, 0.5, sleeps), client=client, lock_path=cu128_lock)
    assert str(failure.value) == (f"push {host}/{image['repository']}:0.5.9-cu128-abc123 failed after 3 attempts: "
                                  f"registry {host} unreachable (connection refused)")
    assert sleeps.delays == [0.5, 1.0]
    assert cu128_lock.read_bytes() == before


def test_registry_answering_500_is_retried_then_a_clear_error_with_the_lock_untouched(client, image, cu128_lock, record_cu128):
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    port = free_port()
    failing = Answers500(port)
    try:
        with pytest.raises(BuildFailure) as failure:
            registry.push(STACK.name, f"127.0.0.1:{port}", retry=registry.Retry(3, 0.01, Sleeps()),
                          client=client, lock_path=cu128_lock)
    finally:
        failing.stop()
    assert str(failure.value) == (f"push 127.0.0.1:{port}/{image['repository']}:0.5.9-cu128-abc123 failed after "
                                  f"3 attempts: registry 127.0.0.1:{port} answered HTTP 500 on /v2/")
    assert failing.requests.count("GET /v2/") == 3
    assert cu128_lock.read_bytes() == before


def test_a_registry_that_recovers_gets_the_push(client, image, cu128_lock, tmp_path, capsys, record_cu128):
    """Down, then answering 500, then up: two retries, then the push lands and the lock records it."""
    record_cu128(cu128_lock, image)
    port = free_port()
    server = Registry(tmp_path / "late", port)
    server.root.mkdir()
    failing: list[Answers500] = []

    def between(attempt: int) -> None:
        if attempt == 1:
            failing.append(Answers500(port))
        else:
            failing[0].stop()
            server.start()

    try:
        sleeps = Sleeps(between)
        pushed = registry.push(STACK.name, server.host, retry=registry.Retry(4, 0.01, sleeps),
                               client=client, lock_path=cu128_lock)
        assert sleeps.delays == [0.01, 0.02]
        assert pushed.manifest_digest == server.manifest_digest(image["repository"], "0.5.9-cu128-abc123")
        assert store.entry(STACK.name, cu128_lock).outcome.push.manifest_digest == pushed.manifest_digest
        err = capsys.readouterr().err
        assert "unreachable (connection refused); retrying in 0.01 s (attempt 2 of 4)" in err
        assert "answered HTTP 500 on /v2/; retrying in 0.02 s (attempt 3 of 4)" in err
    finally:
        server.stop()


def test_pull_checks_the_image_against_the_lock(client, live_registry, image, cu128_lock, record_cu128):
    record_cu128(cu128_lock, image)
    registry.push(STACK.name, live_registry.host, client=client, lock_path=cu128_lock)
    wrong = "sha256:" + "9" * 64
    def record_another_id(lock):
        found = lock.require(STACK.name)
        lock.put(found.with_outcome(image=dataclasses.replace(found.outcome.image, image_id=wrong)))

    store.update(record_another_id, path=cu128_lock)
    with pytest.raises(BuildFailure, match=rf"@sha256:[0-9a-f]{{64}} is image {image['id']}, but matrix.lock records {wrong}$"):
        registry.pull(STACK.name, client=client, lock_path=cu128_lock)


def test_pull_and_push_refuse_what_the_lock_does_not_support(client, image, cu128_lock, record_cu128):
    with pytest.raises(UserError, match=rf"^{STACK.name}: no image recorded in matrix.lock: run `builder build"):
        registry.push(STACK.name, "127.0.0.1:5000", client=client, lock_path=cu128_lock)
    record_cu128(cu128_lock, image)
    records.record_smoke(STACK.name, smoke_report(False, image=image["id"], stack=STACK.name), path=cu128_lock)
    with pytest.raises(UserError, match=rf"^{STACK.name}: image {image['id']} has not passed smoke"):
        registry.push(STACK.name, "127.0.0.1:5000", client=client, lock_path=cu128_lock)
    with pytest.raises(UserError, match=rf"^{STACK.name}: matrix.lock records no push; run `builder push"):
        registry.pull(STACK.name, client=client, lock_path=cu128_lock)
    with pytest.raises(UserError, match="give host\\[:port\\]\\[/namespace\\], without a scheme"):
        registry.split_registry("https://127.0.0.1:5000")


@pytest.mark.parametrize("message, transient", [
    ('Get "http://127.0.0.1:45125/v2/": dial tcp 127.0.0.1:45125: connect: connection refused', True),
    ("received unexpected HTTP status: 500 Internal Server Error", True),
    ("received unexpected HTTP status: 503 Service Unavailable", True),
    ("unauthorized: authentication required", False),
    ("denied: requested access to the resource is denied", False),
    ("manifest invalid: manifest invalid", False),
])
def test_daemon_messages_are_classified(message, transient):
    """Messages as the Docker daemon words them (the first two seen from dockerd 28 here)."""
    assert registry.is_transient(message) is transient
