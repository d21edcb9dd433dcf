"""`builder push` of an image only buildah holds: straight from buildah's storage to a real registry
(Debian's docker-registry on loopback, open and with basic auth), with no Docker daemon at all
(DOCKER_HOST points at nothing). The storage is private (CONTAINERS_STORAGE_CONF), the image tiny."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import bcrypt
import pytest
import requests

from builder.cli.main import main
from builder.config.matrix import load_matrix
from builder.lock import store
from engine_helpers import tar_bytes
from checkouts import REPO
from registries import Registry, free_port

pytestmark = pytest.mark.engine

STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
TAG = "builder-engine-push:0.5.9-cu128-abc123"
USER, PASSWORD = "pusher", "s3cret-pass"


@pytest.fixture(scope="module")
def storage():
    """Private storage (podman's and buildah's 50-character runroot limit: a short path) with one tiny image."""
    root = Path(tempfile.mkdtemp(prefix="enginepush-", dir="/var/tmp"))
    conf = root / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "g"}"\nrunroot = "{root / "r"}"\n')
    env = {"CONTAINERS_STORAGE_CONF": str(conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    layer = root / "layer.tar"
    layer.write_bytes(tar_bytes({"hello.txt": b"pushed from buildah's storage\n"}))

    def buildah(*args: str) -> str:
        return subprocess.run(["buildah", *args], env=env, check=True, capture_output=True, text=True).stdout.strip()

    container = buildah("from", "scratch")
    buildah("add", container, str(layer), "/")
    image_id = "sha256:" + buildah("commit", "--quiet", "--format", "oci", "--timestamp", "0", container, TAG)
    buildah("rm", container)
    yield {"conf": conf, "id": image_id}
    subprocess.run(["buildah", "rmi", "--all", "--force"], env=env, check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def engine_only(storage, monkeypatch, tmp_path, record_image, cu128_lock):
    """The image in buildah's storage only, recorded as the cu128 row's smoke-passed build; no daemon."""
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(storage["conf"]))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    record_image(STACK, storage["id"], [TAG], cu128_lock)
    return cu128_lock


def config_digest(registry: Registry, repository: str, tag: str, auth=None) -> str:
    response = requests.get(f"http://{registry.host}/v2/{repository}/manifests/{tag}", auth=auth, timeout=10,
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    response.raise_for_status()
    return json.loads(response.content)["config"]["digest"]


def test_push_goes_from_buildahs_storage_with_no_docker_daemon(engine_only, storage, tmp_path, capsys):
    registry = Registry(tmp_path / "registry", free_port())
    (tmp_path / "registry").mkdir()
    registry.start()
    try:
        assert main(["push", STACK.name, "--registry", f"{registry.host}/team"]) == 0
        digest = registry.manifest_digest("team/builder-engine-push", "0.5.9-cu128-abc123")
        assert capsys.readouterr().out == (f"{STACK.name}: pushed {registry.host}/team/{TAG} = "
                                           f"{registry.host}/team/builder-engine-push@{digest}\n")
        # The registry holds this very image: its config digest is the image id buildah built.
        assert config_digest(registry, "team/builder-engine-push", "0.5.9-cu128-abc123") == storage["id"]
        assert store.entry(STACK.name, engine_only).outcome.push.manifest_digest == digest
    finally:
        registry.stop()


def test_push_hands_buildah_the_docker_configs_credentials(engine_only, storage, tmp_path, capsys):
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    (tmp_path / "registry").mkdir()
    registry = Registry(tmp_path / "registry", free_port(), htpasswd=htpasswd)
    registry.start()
    try:
        before = engine_only.read_bytes()
        assert main(["push", STACK.name, "--registry", registry.host]) == 2  # no credentials yet: refused, nothing written
        assert "credentials" in capsys.readouterr().err
        assert engine_only.read_bytes() == before
        (tmp_path / "docker-config").mkdir()
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (tmp_path / "docker-config" / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
        assert main(["push", STACK.name, "--registry", registry.host]) == 0
        assert config_digest(registry, "builder-engine-push", "0.5.9-cu128-abc123", (USER, PASSWORD)) == storage["id"]
    finally:
        registry.stop()


def test_an_image_in_neither_store_is_one_line(engine_only, record_image, capsys):
    record_image(STACK, "sha256:" + "1" * 64, ["t:1"], engine_only)
    before = engine_only.read_bytes()
    assert main(["push", STACK.name, "--registry", "127.0.0.1:5000"]) == 2
    err = capsys.readouterr().err
    assert err == (f"builder: error: {STACK.name}: image sha256:{'1' * 64} is in neither the Docker daemon nor "
                   "buildah's storage: build or pull it\n")
    assert engine_only.read_bytes() == before
