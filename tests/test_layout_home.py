"""The write-once layout as the home of the images the builder wrote (engine/written_images.py): after a
write, the tags are the layout's refs and buildah's storage holds nothing of the image; the storage
gets it only when something needs it there (a mount, an archive, `builder smoke`'s container API), by
one import. Real buildah, the test base, a small image."""

from __future__ import annotations

import subprocess

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine import write_once
from builder.engine.buildah import BuildahEngine
from builder.engine.container_limits import own_ulimits
from builder.engine.image_names import image_names
from builder.engine.protocol import BuildRequest
from builder.oci.layer_diff import read_image
from builder.oci.layout import Layout, digest_of
from builder.smoke import smoke_host

pytestmark = pytest.mark.engine

REPOSITORY = "localhost/layout-home"
DOCKERFILE = f"FROM {TEST_BASE_TAG}\nCOPY hello.txt /hello.txt\n"


@pytest.fixture
def engine(base_image, tmp_path, monkeypatch):
    """The host's buildah storage with a layout of the test's own; every name made here goes afterwards."""
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    engine = BuildahEngine(export_to_docker=False)
    yield engine
    for name in Layout(tmp_path / "cache" / "write-once" / "layout").ref_names():
        engine.remove(name)
    for name in image_names(["buildah"], TEST_BASE_TAG):
        if name.startswith(REPOSITORY):
            engine.remove(name)


def write(engine: BuildahEngine, tmp_path, text: str, *tags: str):
    context = write_context(tmp_path / f"ctx-{text}", DOCKERFILE, {"hello.txt": f"{text}\n"})
    return engine.build(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=tags,
                                     source_date_epoch=EPOCH, network="none"))


def in_storage(image_id: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", image_id], capture_output=True).returncode == 0


def home(tmp_path) -> Layout:
    return Layout(tmp_path / "cache" / "write-once" / "layout")


def test_a_written_image_is_named_by_the_layouts_refs_and_not_stored(engine, tmp_path):
    first = write(engine, tmp_path, "one", f"{REPOSITORY}:1", f"{REPOSITORY}:moving")
    assert not in_storage(first.image_id)
    assert home(tmp_path).ref_names(first.image_id) == (f"{REPOSITORY}:1", f"{REPOSITORY}:moving")
    assert engine.exists("layout-home:1") and engine.image_id(f"{REPOSITORY}:moving") == first.image_id
    info = engine.inspect(f"{REPOSITORY}:1")
    assert (info.image_id, info.tags) == (first.image_id, (f"{REPOSITORY}:1", f"{REPOSITORY}:moving"))
    assert digest_of(info.config_bytes) == first.image_id and info.layers == first.layers
    assert all(layer.size for layer in info.layers)

    # A second image takes the moving tag, in the same index write as its own.
    second = write(engine, tmp_path, "two", f"{REPOSITORY}:2", f"{REPOSITORY}:moving")
    assert home(tmp_path).ref_images() == {f"{REPOSITORY}:1": first.image_id, f"{REPOSITORY}:2": second.image_id,
                                           f"{REPOSITORY}:moving": second.image_id}
    engine.tag(f"{REPOSITORY}:1", f"{REPOSITORY}:copy")
    assert engine.image_id(f"{REPOSITORY}:copy") == first.image_id and not in_storage(first.image_id)

    # An image of the storage's own takes a name from the layout: the storage answers for it now.
    engine.tag(TEST_BASE_TAG, f"{REPOSITORY}:copy")
    assert engine.image_id(f"{REPOSITORY}:copy") == engine.image_id(TEST_BASE_TAG) != first.image_id
    assert f"{REPOSITORY}:copy" not in home(tmp_path).ref_names()

    engine.remove(f"{REPOSITORY}:1")
    assert not engine.exists(f"{REPOSITORY}:1") and engine.exists(first.image_id)  # the layout still holds it


def test_a_failure_while_tagging_moves_no_tag(engine, tmp_path, monkeypatch):
    first = write(engine, tmp_path, "one", f"{REPOSITORY}:1", f"{REPOSITORY}:moving")
    shared, real = home(tmp_path).root, Layout.write_index

    def full_disk(self, manifests):
        if self.root == shared:
            raise OSError(28, "No space left on device")
        real(self, manifests)  # the build's own scratch layouts

    with monkeypatch.context() as patched, pytest.raises(OSError, match="No space left"):
        patched.setattr(Layout, "write_index", full_disk)
        write(engine, tmp_path, "two", f"{REPOSITORY}:2", f"{REPOSITORY}:moving")
    assert home(tmp_path).ref_images() == {f"{REPOSITORY}:1": first.image_id, f"{REPOSITORY}:moving": first.image_id}


def test_the_storage_gets_a_written_image_only_when_something_needs_it_there(engine, tmp_path, monkeypatch):
    first = write(engine, tmp_path, "one", f"{REPOSITORY}:1")
    second = write(engine, tmp_path, "two", f"{REPOSITORY}:2")
    assert not in_storage(first.image_id) and not in_storage(second.image_id)

    with engine.mounted(f"{REPOSITORY}:1") as root:
        assert (root / "hello.txt").read_text() == "one\n"
    assert image_names(["buildah"], first.image_id) == {f"{REPOSITORY}:1"}
    engine.save(second.image_id, tmp_path / "second.tar")  # by id: named as the layout names it
    assert read_image(tmp_path / "second.tar").config_digest == second.image_id
    assert image_names(["buildah"], second.image_id) == {f"{REPOSITORY}:2"}

    def no_import(*args, **kwargs):
        raise AssertionError("an image the storage holds was imported again")

    with monkeypatch.context() as patched:
        patched.setattr(write_once, "import_image", no_import)
        with engine.mounted(first.image_id) as root:
            assert (root / "hello.txt").read_text() == "one\n"
        engine.save(f"{REPOSITORY}:2", tmp_path / "again.tar")
    # The storage's copy goes with the name.
    engine.remove(f"{REPOSITORY}:1")
    assert not in_storage(first.image_id)


def test_a_name_the_layout_takes_leaves_the_storage_unless_it_is_the_last_of_the_storages_own_image(engine,
                                                                                                  tmp_path):
    base_id = engine.image_id(TEST_BASE_TAG)
    engine.tag(TEST_BASE_TAG, f"{REPOSITORY}:1")  # the storage's own image, by a second name
    scratch = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True, check=True).stdout
    subprocess.run(["buildah", "commit", "--quiet", "--rm", scratch.strip(), f"{REPOSITORY}:own"], check=True,
                   capture_output=True)
    own_id = engine.image_id(f"{REPOSITORY}:own")  # an image of the storage's own, by its one name

    first = write(engine, tmp_path, "one", f"{REPOSITORY}:1", f"{REPOSITORY}:own")
    assert image_names(["buildah"], base_id) == {TEST_BASE_TAG}
    assert image_names(["buildah"], own_id) == {f"{REPOSITORY}:own"}  # kept, as the image's last name
    assert engine.image_id(f"{REPOSITORY}:1") == engine.image_id(f"{REPOSITORY}:own") == first.image_id

    # A copy the storage holds only as a cache goes with its name: the layout still holds the image.
    engine.ensure_in_storage(f"{REPOSITORY}:1")
    second = write(engine, tmp_path, "two", f"{REPOSITORY}:1")
    assert not in_storage(first.image_id) and engine.image_id(f"{REPOSITORY}:1") == second.image_id
    engine.remove(f"{REPOSITORY}:own")
    assert not in_storage(own_id)


def test_builder_smoke_of_a_written_image_runs_it_through_the_storage(engine, tmp_path):
    written = write(engine, tmp_path, "smoke", f"{REPOSITORY}:smoke")
    with smoke_host.client_for(f"{REPOSITORY}:smoke", engine) as client:
        assert client.images.get(f"{REPOSITORY}:smoke").id == written.image_id
        container = client.containers.create(f"{REPOSITORY}:smoke", ["cat", "/hello.txt"], network_mode="none",
                                             ulimits=own_ulimits())
        try:
            container.start()
            assert container.wait()["StatusCode"] == 0 and container.logs() == b"smoke\n"
        finally:
            container.remove(force=True)
