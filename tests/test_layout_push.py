"""`builder push` of an image the builder wrote: the blobs go from its OCI layout (engine/layout_push.py)
to a real registry (Debian's docker-registry on loopback), only those the registry lacks; the registry
stores the layout's own manifest, and the Docker daemon pulls it back by that digest as the same image."""

from __future__ import annotations

import re

import docker
import pytest

from builder.cli.main import main
from builder.config.matrix import load_matrix
from builder.engine import layout_push
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
from builder.lock import store
from builder.oci.layout import Layout, deterministic_json, digest_of
from builder.paths import cache_root
from checkouts import REPO
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context
from registries import Registry, free_port

pytestmark = pytest.mark.engine

STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
REPOSITORY = "builder-layout-push"


def written_image(tmp_path, name: str, text: str) -> str:
    """A small image written by the builder (the base, one COPY): in its layout only, named by its refs."""
    context = write_context(tmp_path / name, (f"FROM {TEST_BASE_TAG}\nCOPY hello.txt /hello.txt\n"),
                            {"hello.txt": text})
    tag = f"localhost/{REPOSITORY}:{name}"
    return BuildahEngine(export_to_docker=False).build(BuildRequest(
        context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,), source_date_epoch=EPOCH,
        build_args={}, network="none")).image_id


def uploads(registry: Registry) -> int:
    """Blob uploads the registry finished (PUT .../blobs/uploads/...), from its request log."""
    log = (registry.root / "registry.log").read_text(errors="replace")
    return len(re.findall(r'http\.request\.method=PUT .*http\.request\.uri="/v2/[^"]*/blobs/uploads/', log))


@pytest.fixture
def written(base_image, tmp_path, monkeypatch, cu128_lock, record_image):
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "docker-config").mkdir()
    (tmp_path / "docker-config" / "config.json").write_text('{"auths": {}}')
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    made = []

    def write(name: str, text: str) -> str:
        image_id = written_image(tmp_path, name, text)
        made.append(f"localhost/{REPOSITORY}:{name}")
        record_image(STACK, image_id, [f"{REPOSITORY}:0.5.9-cu128-{name}"], cu128_lock)
        return image_id

    yield write
    for tag in made:
        BuildahEngine(export_to_docker=False).remove(tag)


def test_push_sends_the_layouts_blobs_the_registry_lacks_and_its_manifest(written, cu128_lock, tmp_path, capsys):
    registry = Registry(tmp_path / "registry", free_port(), log_level="info")
    (tmp_path / "registry").mkdir()
    registry.start()
    client = docker.from_env()
    try:
        first = written("one", "first\n")
        layout = Layout(cache_root() / "write-once" / "layout")
        config, layers = layout_push.held_image(layout, first)
        assert digest_of(config) == first and len(layers) == 2  # the base's layer and the COPY's
        expected_manifest = digest_of(deterministic_json({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": first, "size": len(config)},
            "layers": layers}))

        assert main(["push", STACK.name, "--registry", registry.host]) == 0
        digest = registry.manifest_digest(REPOSITORY, "0.5.9-cu128-one")
        assert digest == expected_manifest  # the layout's manifest, untouched on the way
        assert store.entry(STACK.name, cu128_lock).outcome.push.manifest_digest == digest
        assert uploads(registry) == 3  # two layers and the config
        capsys.readouterr()

        # The same image again: every blob is there, none is sent.
        assert main(["push", STACK.name, "--registry", registry.host]) == 0
        assert uploads(registry) == 3

        # Another image on the same base: only its own layer and config go.
        second = written("two", "second\n")
        assert main(["push", STACK.name, "--registry", registry.host]) == 0
        assert uploads(registry) == 5
        pushed = store.entry(STACK.name, cu128_lock).outcome.push
        assert pushed.tag == "0.5.9-cu128-two" and pushed.manifest_digest != digest

        # The Docker daemon pulls the uncompressed layers by the locked digest: the same image id.
        assert main(["pull", STACK.name]) == 0
        assert client.images.get(f"{REPOSITORY}:0.5.9-cu128-two").id == second
    finally:
        registry.stop()
        # The pulled image by id: its digest reference names it too, and would keep it otherwise.
        pulled = client.images.list(name=REPOSITORY) + client.images.list(name=f"{registry.host}/{REPOSITORY}")
        for image_id in {image.id for image in pulled}:
            client.images.remove(image_id, force=True)


def test_a_layout_missing_a_layer_is_not_pushed_from(written, tmp_path):
    image_id = written("three", "third\n")
    layout = Layout(cache_root() / "write-once" / "layout")
    config, layers = layout_push.held_image(layout, image_id)
    layout.remove_blob(layers[-1]["digest"])
    assert layout_push.held_image(layout, image_id) is None
    layout.remove_blob(image_id)
    assert layout_push.held_image(layout, image_id) is None
