"""Immutable tags on a registry that needs a login: Debian's docker-registry (a compose service
published on loopback) with htpasswd (basic) or token authentication, the credentials where
`docker login` puts them, the real daemon."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import bcrypt
import pytest
import requests

from builder.cli.main import main
from builder.config.matrix import load_matrix
from builder.errors import BuildFailure, UserError
from builder.lock import store
from builder.net import registry_auth
from builder.publish import registry

from checkouts import REPO
from compose_tools import compose_command
from registries import Registry, TokenIssuer

STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")

pytestmark = pytest.mark.engine

USER, PASSWORD = "builder", "s3cret-passw0rd"
TAG = "0.5.9-cu128-abc123"


def loopback_port(taken: tuple[int, ...] = ()) -> int:
    """A free port in 5100-5199, the range these tests keep to, other than `taken` (chosen, not yet bound)."""
    for port in (p for p in range(5100, 5200) if p not in taken):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port in 5100-5199")


# Both registries are compose services (tests/compose/registry-auth.yaml) that pytest-docker's
# docker_services starts once for this module; each test pushes an image of its own repository.
@pytest.fixture(scope="module")
def registries(tmp_path_factory):
    """The registry folders and ports, and the token service (a thread here) the `token` one trusts."""
    basic_root, token_root = tmp_path_factory.mktemp("basic-registry"), tmp_path_factory.mktemp("token-registry")
    htpasswd = basic_root / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    issuer = TokenIssuer(token_root / "token", loopback_port(), USER, PASSWORD)
    basic = Registry(basic_root, loopback_port(), htpasswd=htpasswd)
    token = Registry(token_root, loopback_port(taken=(basic.port,)), token=issuer)
    for server in (basic, token):
        (server.root / "config.yml").write_text(server.config(seen_as=Path("/registry")))
    yield {"basic": basic, "token": token}
    issuer.stop()


@pytest.fixture(scope="module")
def docker_compose_command(registries, registry_container_image, tmp_path_factory) -> str:
    return compose_command(tmp_path_factory.mktemp("compose") / "registries.env", {
        "REGISTRY_IMAGE": registry_container_image,
        **{f"{name.upper()}_{key}": value for name, server in registries.items()
           for key, value in (("ROOT", server.root), ("PORT", server.port))}})


@pytest.fixture(scope="module")
def docker_compose_file() -> str:
    return str(REPO / "tests" / "compose" / "registry-auth.yaml")


@pytest.fixture(scope="module")
def docker_compose_project_name() -> str:
    return f"builder-registry-auth-test-{os.getpid()}"


@pytest.fixture(scope="module")
def docker_cleanup() -> list[str]:
    return ["down --volumes --timeout 10"]


@pytest.fixture
def running(registries, compose_down_guard, docker_services):
    for server in registries.values():
        docker_services.wait_until_responsive(check=server.responds, timeout=30, pause=0.1)
    return registries


@pytest.fixture
def secured(running) -> Registry:
    """The registry asking every request for a login (htpasswd holds one bcrypt entry)."""
    return running["basic"]


def docker_config(tmp_path, monkeypatch, host: str, user: str | None, password: str = PASSWORD) -> None:
    """DOCKER_CONFIG as `docker login HOST` leaves it (or with no entry for HOST)."""
    folder = tmp_path / "docker-config"
    folder.mkdir(exist_ok=True)
    auths = {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}} if user else {}
    (folder / "config.json").write_text(json.dumps({"auths": auths}))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))


def manifest_config_digest(server: Registry, repository: str) -> str:
    response = requests.get(f"http://{server.host}/v2/{repository}/manifests/{TAG}", auth=(USER, PASSWORD),
                            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=10)
    response.raise_for_status()
    return response.json()["config"]["digest"]


def test_the_registry_really_wants_a_login(secured):
    response = requests.get(f"http://{secured.host}/v2/", timeout=10)
    assert response.status_code == 401
    assert registry_auth.parse_challenge(response.headers["WWW-Authenticate"]) == ("basic", {"realm": "builder-test"})


def test_right_credentials_push(client, secured, image, cu128_lock, tmp_path, monkeypatch, record_cu128):
    docker_config(tmp_path, monkeypatch, secured.host, USER)
    record_cu128(cu128_lock, image)
    pushed = registry.push(STACK.name, secured.host, client=client, lock_path=cu128_lock)
    assert manifest_config_digest(secured, image["repository"]) == image["id"]
    assert store.entry(STACK.name, cu128_lock).outcome.push.manifest_digest == pushed.manifest_digest
    # The same image again: the probe reads the tag (authenticated) and finds this very image.
    assert registry.push(STACK.name, secured.host, client=client, lock_path=cu128_lock).manifest_digest == pushed.manifest_digest


def test_an_existing_immutable_tag_is_refused(client, secured, image, cu128_lock, tmp_path, monkeypatch, record_cu128):
    """Anonymously the registry answers 401 to everything: read as 'absent', the tag would move."""
    docker_config(tmp_path, monkeypatch, secured.host, USER)
    record_cu128(cu128_lock, image)
    registry.push(STACK.name, secured.host, client=client, lock_path=cu128_lock)
    client.api.import_image_from_data(b"\0" * 2048, repository=image["repository"], tag="other")
    other_id = client.images.get(f"{image['repository']}:other").id
    try:
        record_cu128(cu128_lock, {**image, "id": other_id})
        before = cu128_lock.read_bytes()
        with pytest.raises(BuildFailure, match=rf"already names another image \({image['id']}\); "
                                               "immutable tags are never moved$"):
            registry.push(STACK.name, secured.host, client=client, lock_path=cu128_lock)
        assert cu128_lock.read_bytes() == before
        assert manifest_config_digest(secured, image["repository"]) == image["id"]
    finally:
        client.images.remove(other_id, force=True)


def test_missing_credentials_are_one_clear_line(client, secured, image, cu128_lock, tmp_path, monkeypatch, capsys, record_cu128):
    docker_config(tmp_path, monkeypatch, secured.host, None)
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    assert main(["push", STACK.name, "--registry", secured.host]) == 2
    err = capsys.readouterr().err
    assert err == (f"builder: error: {secured.host} needs a login to tell whether {image['repository']}:{TAG} "
                   f"exists, and {tmp_path}/docker-config/config.json has no credentials for it: "
                   f"run `docker login {secured.host}`\n")
    assert cu128_lock.read_bytes() == before
    missing = requests.get(f"http://{secured.host}/v2/{image['repository']}/manifests/{TAG}",
                           auth=(USER, PASSWORD), timeout=10)
    assert missing.status_code == 404  # nothing was pushed


def test_refused_credentials_are_one_clear_line(client, secured, image, cu128_lock, tmp_path, monkeypatch, record_cu128):
    docker_config(tmp_path, monkeypatch, secured.host, USER, password="wrong")
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    with pytest.raises(UserError) as refusal:
        registry.push(STACK.name, secured.host, client=client, lock_path=cu128_lock)
    assert str(refusal.value) == (
        f"{secured.host} refused the credentials in {tmp_path}/docker-config/config.json for reading "
        f"{image['repository']}:{TAG} (HTTP 401): run `docker login {secured.host}` again")
    assert cu128_lock.read_bytes() == before


# ---- token auth: the registry sends a Bearer challenge; a token service signs the tokens ----------


@pytest.fixture
def token_secured(running) -> Registry:
    """The registry with Distribution's token auth, and the token service it trusts."""
    return running["token"]


def bearer_manifest_digest(server: Registry, repository: str) -> str:
    url = f"http://{server.host}/v2/{repository}/manifests/{TAG}"
    _, params = registry_auth.parse_challenge(requests.get(url, timeout=10).headers["WWW-Authenticate"])
    token = requests.get(params["realm"], params={"service": params["service"], "scope": params["scope"]},
                         auth=(USER, PASSWORD), timeout=10).json()["token"]
    response = requests.get(url, timeout=10, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    response.raise_for_status()
    return response.json()["config"]["digest"]


def test_bearer_challenge_token_push_and_the_immutable_tag(client, token_secured, image, cu128_lock, tmp_path,
                                                           monkeypatch, record_cu128):
    server = token_secured
    scheme, params = registry_auth.parse_challenge(requests.get(f"http://{server.host}/v2/", timeout=10)
                                                   .headers["WWW-Authenticate"])
    assert (scheme, params["realm"], params["service"]) == ("bearer", server.token.realm, server.token.service)
    docker_config(tmp_path, monkeypatch, server.host, USER)
    record_cu128(cu128_lock, image)
    pushed = registry.push(STACK.name, server.host, client=client, lock_path=cu128_lock)
    assert bearer_manifest_digest(server, image["repository"]) == image["id"]
    assert any(f"scope=repository%3A{image['repository']}%3Apull" in r for r in server.token.requests)
    assert registry.push(STACK.name, server.host, client=client, lock_path=cu128_lock).manifest_digest == pushed.manifest_digest
    client.api.import_image_from_data(b"\0" * 4096, repository=image["repository"], tag="other")
    other_id = client.images.get(f"{image['repository']}:other").id
    try:
        record_cu128(cu128_lock, {**image, "id": other_id})
        with pytest.raises(BuildFailure, match=rf"already names another image \({image['id']}\)"):
            registry.push(STACK.name, server.host, client=client, lock_path=cu128_lock)
        assert bearer_manifest_digest(server, image["repository"]) == image["id"]
    finally:
        client.images.remove(other_id, force=True)


def test_a_token_service_that_refuses_the_credentials_refuses_the_push(client, token_secured, image, cu128_lock,
                                                                       tmp_path, monkeypatch, record_cu128):
    server = token_secured
    docker_config(tmp_path, monkeypatch, server.host, USER, password="wrong")
    record_cu128(cu128_lock, image)
    before = cu128_lock.read_bytes()
    with pytest.raises(UserError, match=rf"^{server.host} refused the credentials in .*config.json for reading "
                                        rf"{image['repository']}:{TAG} \(HTTP 401\): run `docker login"):
        registry.push(STACK.name, server.host, client=client, lock_path=cu128_lock)
    assert cu128_lock.read_bytes() == before
