"""Registry base tags resolved to manifest digests through the registry's HTTP API: Debian's
docker-registry on loopback holding images put there through that same API, open, with token auth
(anonymous pull tokens as Docker Hub gives them, or the Docker config's credentials), down, or
answering 500."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import tarfile
from urllib.parse import urljoin

import pytest
import requests

from builder.config.stack import Base
from builder.errors import UserError
from builder.lock import base_digest
from builder.net.registry_http import Retry
from registries import Registry, TokenIssuer, free_port

USER, PASSWORD = "builder", "s3cret-passw0rd"
REPOSITORY, TAG = "nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _upload(host: str, repository: str, blob: bytes, headers: dict) -> dict:
    """A blob through the monolithic upload (POST, then PUT with its digest); its OCI descriptor."""
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    started = requests.post(f"http://{host}/v2/{repository}/blobs/uploads/", headers=headers, timeout=10)
    assert started.status_code == 202, started.text
    done = requests.put(urljoin(f"http://{host}/", started.headers["Location"]), params={"digest": digest},
                        data=blob, headers={**headers, "Content-Type": "application/octet-stream"}, timeout=10)
    assert done.status_code == 201, done.text
    return {"digest": digest, "size": len(blob)}


def _put_manifest(host: str, repository: str, tag: str, media_type: str, manifest: dict, headers: dict) -> str:
    body = json.dumps(manifest, sort_keys=True).encode()
    answer = requests.put(f"http://{host}/v2/{repository}/manifests/{tag}", data=body, timeout=10,
                          headers={**headers, "Content-Type": media_type})
    assert answer.status_code == 201, answer.text
    return "sha256:" + hashlib.sha256(body).hexdigest()


def put_image(host: str, repository: str, tag: str, headers: dict | None = None) -> dict:
    """A one-file image under `tag` and an index (the multi-platform form nvidia/cuda has) listing it
    under `tag`-multi, put through the registry API; their manifest digests."""
    headers = headers or {}
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        archive.addfile(info, io.BytesIO(b"hello\n"))
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()]}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           **_upload(host, repository, config, headers)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            **_upload(host, repository, layer.getvalue(), headers)}]}
    image = _put_manifest(host, repository, tag, OCI_MANIFEST, manifest, headers)
    size = len(json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": image, "size": size, "platform": {"architecture": "amd64", "os": "linux"}}]}
    return {"image": image, "index": _put_manifest(host, repository, f"{tag}-multi", OCI_INDEX, index, headers)}


@pytest.fixture
def no_login(tmp_path, monkeypatch):
    """A Docker config with no credentials at all."""
    (tmp_path / "docker-config").mkdir()
    (tmp_path / "docker-config" / "config.json").write_text('{"auths": {}}')
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


@pytest.fixture
def open_registry(tmp_path):
    server = Registry(tmp_path / "registry", free_port())
    server.root.mkdir()
    server.start()
    yield server
    server.stop()


def token_registry(tmp_path, anonymous_pull: bool):
    issuer = TokenIssuer(tmp_path / "token", free_port(), USER, PASSWORD, anonymous_pull=anonymous_pull)
    server = Registry(tmp_path / "registry", free_port(), token=issuer)
    server.root.mkdir()
    server.start()
    return server


def test_a_tag_resolves_to_the_digest_of_what_it_names(open_registry, no_login):
    put = put_image(open_registry.host, REPOSITORY, TAG)
    assert base_digest.resolve(f"{open_registry.host}/{REPOSITORY}:{TAG}") == put["image"] \
        == open_registry.manifest_digest(REPOSITORY, TAG)
    # A multi-platform tag pins its index, as `docker pull` resolves it: one pin for every platform.
    assert base_digest.resolve(f"{open_registry.host}/{REPOSITORY}:{TAG}-multi") == put["index"]


def test_a_bearer_registry_gives_an_anonymous_pull_token(tmp_path, no_login):
    server = token_registry(tmp_path, anonymous_pull=True)
    try:
        push = {"Authorization": f"Bearer {server.token.sign([f'repository:{REPOSITORY}:pull,push'])}"}
        put = put_image(server.host, REPOSITORY, TAG, push)
        assert requests.get(f"http://{server.host}/v2/{REPOSITORY}/manifests/{TAG}", timeout=10).status_code == 401
        assert base_digest.resolve(f"{server.host}/{REPOSITORY}:{TAG}") == put["image"]
        assert server.token.requests[-1] == (f"/token?service={server.token.service}"
                                             f"&scope=repository%3A{REPOSITORY.replace('/', '%2F')}%3Apull")
    finally:
        server.stop()
        server.token.stop()


def test_a_bearer_registry_gets_the_docker_config_login(tmp_path, monkeypatch):
    server = token_registry(tmp_path, anonymous_pull=False)
    image = f"{server.host}/{REPOSITORY}:{TAG}"
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))

    def login(password: str) -> None:
        auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {server.host: {"auth": auth}}}))

    try:
        push = {"Authorization": f"Bearer {server.token.sign([f'repository:{REPOSITORY}:pull,push'])}"}
        put = put_image(server.host, REPOSITORY, TAG, push)
        login(PASSWORD)
        assert base_digest.resolve(image) == put["image"]
        login("wrong")
        with pytest.raises(UserError) as refused:
            base_digest.resolve(image)
        assert str(refused.value) == (f"base {image}: {server.host} refused the credentials in {config}/config.json "
                                      f"(HTTP 401): run `docker login {server.host}`")
        (config / "config.json").write_text('{"auths": {}}')
        with pytest.raises(UserError, match=rf"^base {image}: {server.host} wants a login, and there is none in "):
            base_digest.resolve(image)
    finally:
        server.stop()
        server.token.stop()


def test_a_missing_tag_is_one_line(open_registry, no_login):
    image = f"{open_registry.host}/{REPOSITORY}:12.0-nowhere"
    with pytest.raises(UserError) as missing:
        base_digest.resolve(image)
    assert str(missing.value) == f"base {image}: {open_registry.host} has no tag 12.0-nowhere in {REPOSITORY} (HTTP 404)"


def test_an_unreachable_registry_is_retried_then_named(no_login, capsys):
    host = f"127.0.0.1:{free_port()}"
    delays: list[float] = []
    with pytest.raises(UserError) as down:
        base_digest.resolve(f"{host}/{REPOSITORY}:{TAG}", Retry(3, 0.5, delays.append, UserError))
    assert str(down.value) == (f"resolving base {host}/{REPOSITORY}:{TAG} failed after 3 attempts: "
                               f"registry {host} unreachable (connection refused)")
    assert delays == [0.5, 1.0]
    assert capsys.readouterr().err.count("retrying in") == 2


@pytest.mark.parametrize("image, expected", [
    ("nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04",
     ("docker.io", "registry-1.docker.io", "nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04")),
    ("debian", ("docker.io", "registry-1.docker.io", "library/debian", "latest")),
    ("127.0.0.1:5000/nvidia/cuda", ("127.0.0.1:5000", "127.0.0.1:5000", "nvidia/cuda", "latest")),
    ("localhost/base:1", ("localhost", "localhost", "base", "1")),
    ("registry.example/team/cuda:12.8.1", ("registry.example", "registry.example", "team/cuda", "12.8.1")),
])
def test_references_are_read_as_docker_pull_reads_them(image, expected):
    base = base_digest.parse(image)
    assert (base.registry, base.api_host, base.repository, base.tag) == expected


@pytest.mark.parametrize("image, message", [
    ("nvidia/cuda@sha256:" + "a" * 64, "give a tag, not a digest; `builder lock` resolves the digest"),
    ("NVIDIA/Cuda:13", "not an image reference (registry/name:tag)"),
    ("nvidia/cuda:bad tag", "not an image reference (registry/name:tag)"),
])
def test_malformed_references_are_refused(image, message):
    with pytest.raises(UserError) as refused:
        base_digest.parse(image)
    assert str(refused.value) == f"base {image}: {message}"


@pytest.mark.parametrize("image, digest, expected", [
    ("nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04", "sha256:" + "a" * 64, "nvidia/cuda@sha256:" + "a" * 64),
    ("127.0.0.1:5000/nvidia/cuda:13.0.1", "sha256:" + "b" * 64, "127.0.0.1:5000/nvidia/cuda@sha256:" + "b" * 64),
    ("127.0.0.1:5000/cuda", "sha256:" + "c" * 64, "127.0.0.1:5000/cuda@sha256:" + "c" * 64),
    ("debian:bookworm", "sha256:" + "d" * 64, "debian@sha256:" + "d" * 64),
    ("nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04", "", "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"),
])
def test_from_names_a_registry_base_by_digest_once_resolved(image, digest, expected):
    """name@digest without the tag: buildah's pull refuses a reference with both."""
    base = Base("b", image, "3.12", "/usr/bin/python3.12", (), "13.0.1", False)
    assert base.reference(digest) == expected
    assert dataclasses.replace(base, local=True).reference(digest) == image
