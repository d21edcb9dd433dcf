"""`builder build --load`, as buildx: the Docker daemon gets the passed image only when asked, under its
tags, with the same id; without --load a build's engine copies nothing there. A tiny image written on the
test base in private buildah storage (a short path: podman's runroot limit). The fixture is not called
`built`: that name puts a module in the default row's lane (tests/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import docker
import pytest

from builder.engine import get_engine
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
from builder.errors import UserError
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

pytestmark = pytest.mark.engine


@pytest.fixture
def small_image(tmp_path, base_image):
    root = Path(tempfile.mkdtemp(prefix="load-", dir="/var/tmp"))
    engine = BuildahEngine(storage_dir=root / "s", export_to_docker=False)
    engine.load(base_image.archive)
    name = f"localhost/builder-load-test-{uuid.uuid4().hex[:8]}"
    context = write_context(tmp_path / "context", f"FROM {TEST_BASE_TAG}\nCOPY note.txt /note.txt\n",
                            {"note.txt": f"{name}\n"})
    result = engine.build(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(f"{name}:candidate",),
                                       source_date_epoch=EPOCH, network="none"))
    tags = [f"{name}:0.5.9-abc", f"{name}:moving"]
    for tag in tags:
        engine.tag(result.image_id, tag)
    yield engine, result, tags
    client = docker.from_env()
    if any(image.id == result.image_id for image in client.images.list(name=name)):
        client.images.remove(result.image_id, force=True)
    engine.reset_storage()
    shutil.rmtree(root)


def test_a_build_without_load_leaves_the_docker_daemon_alone(small_image):
    engine, result, tags = small_image
    assert result.delivered_bytes == 0
    client = docker.from_env()
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(result.image_id)
    assert [store for store, _ in engine.stores()] == ["buildah"]  # the immutable guard looks only there


def test_load_puts_the_image_into_docker_under_its_tags_once(small_image):
    engine, result, tags = small_image
    loader = engine.docker_loader()
    assert loader.storage_dir == engine.storage_dir and loader.export_to_docker
    moved = loader.load_into_docker(result, tags)
    # The note's layer at least; the base's too unless the daemon holds it already (other tests load it).
    assert 0 < result.layers[-1].size <= moved <= sum(layer.size for layer in result.layers)
    client = docker.from_env()
    assert [client.images.get(tag).id for tag in tags] == [result.image_id, result.image_id]
    assert loader.load_into_docker(result, tags) == 0  # already there: nothing moves again


def test_an_engine_that_delivers_nowhere_refuses_to_load(small_image):
    engine, result, tags = small_image
    with pytest.raises(UserError, match="delivers nowhere"):
        engine.load_into_docker(result, tags)


def test_the_docker_engine_has_nothing_to_load():
    assert get_engine("docker").docker_loader() is None
