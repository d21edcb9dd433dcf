"""The immutable-tag guard on its own: which store, which ids, and where the two images part."""

from __future__ import annotations

import pytest

from builder.build_stack import immutable
from builder.engine.identity import EngineIdentity
from builder.engine.protocol import ImageInfo, Layer
from builder.errors import BuildFailure
from builder.lock.model import ImageRecord, LockedBase

OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def image(image_id: str, diff_ids: list[str], labels: dict) -> ImageInfo:
    layers = tuple(Layer(d, 1, f"step {i}") for i, d in enumerate(diff_ids))
    return ImageInfo(image_id, (), "", labels, layers, {"config": {"Labels": labels}, "rootfs": {"diff_ids": diff_ids}})


class Store:
    def __init__(self, tags: dict, images: dict):
        self.tags, self.images = tags, images

    def image_id(self, ref):
        return self.tags.get(ref) or (ref if ref in self.images else None)

    def inspect(self, ref):
        return self.images[self.image_id(ref)]


class Engine:
    def __init__(self, *stores):
        self._stores = stores

    def stores(self):
        return self._stores


def test_an_absent_tag_or_the_same_image_passes():
    images = {NEW: image(NEW, ["sha256:1"], {})}
    immutable.check(Engine(("buildah", Store({}, images))), "sglang:x-1", NEW)
    immutable.check(Engine(("buildah", Store({"sglang:x-1": NEW}, images))), "sglang:x-1", NEW)


def test_another_image_names_the_store_both_ids_and_the_first_differing_layer():
    images = {OLD: image(OLD, ["sha256:1", "sha256:2"], {}), NEW: image(NEW, ["sha256:1", "sha256:3"], {})}
    engine = Engine(("buildah", Store({}, images)), ("docker daemon", Store({"sglang:x-1": OLD}, images)))
    with pytest.raises(BuildFailure, match=rf"^immutable tag sglang:x-1 already names {OLD} \(made by an unrecorded "
                                           rf"engine\) in docker daemon, this build made {NEW} \(with an unrecorded "
                                           rf"engine\): first differing layer #2, made by: step 1;"):
        immutable.check(engine, "sglang:x-1", NEW)


def test_both_engine_versions_are_named_from_the_build_and_the_lock():
    images = {OLD: image(OLD, ["sha256:1", "sha256:2"], {}), NEW: image(NEW, ["sha256:1", "sha256:3"], {})}
    locked = record(OLD, EngineIdentity("buildah", "1.28.2"))
    with pytest.raises(BuildFailure, match=rf"already names {OLD} \(made by buildah 1.28.2\) in buildah, "
                                           rf"this build made {NEW} \(with buildah 1.39.3\)"):
        immutable.check(Engine(("buildah", Store({"sglang:x-1": OLD}, images))), "sglang:x-1", NEW,
                        EngineIdentity("buildah", "1.39.3"), locked)


def record(image_id: str, engine: EngineIdentity | None) -> ImageRecord:
    base = LockedBase("debian-bookworm", "localhost/builder-base:debian-bookworm", True)
    return ImageRecord(image_id, "sglang:x-1", ("sglang:x-1",), "f" * 64, base, 0, "r.json", "p.json", engine=engine)


@pytest.mark.parametrize("locked", [
    None, record(NEW, EngineIdentity("buildah", "1.28.2")),  # the lock records another image
    record(OLD, None),  # recorded before engines were
], ids=["none", "another-image", "unrecorded"])
def test_a_lock_record_that_does_not_name_the_held_images_engine_says_unrecorded(locked):
    assert immutable.recorded_engine(locked, OLD) is None


@pytest.mark.parametrize("half", [
    {"name": "buildah"}, {"name": "", "version": "1"}, {"name": "b", "version": 1}, {"version": "1.28.2"},
])
def test_a_half_engine_record_in_the_lock_is_refused(half):
    with pytest.raises(ValueError, match="engine identity needs a name and a version"):
        EngineIdentity.from_dict(half)


def test_engine_identity_round_trips_and_refuses_half_a_record():
    identity = EngineIdentity("buildah", "1.39.3")
    assert EngineIdentity.from_dict(identity.to_dict()) == identity
    assert str(identity) == "buildah 1.39.3"
    with pytest.raises(ValueError):
        EngineIdentity.from_dict({"name": "buildah"})


def test_equal_layers_name_the_differing_config_fields():
    images = {OLD: image(OLD, ["sha256:1"], {"revision": "abc"}), NEW: image(NEW, ["sha256:1"], {})}
    with pytest.raises(BuildFailure, match=r"all layers equal; config differs in config.Labels.revision;"):
        immutable.check(Engine(("buildah", Store({"sglang:x-1": OLD}, images))), "sglang:x-1", NEW)
