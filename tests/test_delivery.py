"""Delivery into the Docker daemon: which layers it lacks, a partial copy refused and made whole, an image
only buildah's storage holds (real buildah, real daemon). The written image's delivery: test_delivery_write.py."""

import hashlib
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine import delivery
from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import DockerDaemon
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure
from builder.oci.layer_diff import discard_storage

BIG = 4_000_000  # bytes of the shared layer: what a full copy would move again

DOCKERFILE = f"""\
FROM {TEST_BASE_TAG}
RUN ["sh", "-c", "head -c {BIG} /dev/zero | tr '\\\\0' x > /big"]
COPY note.txt /note.txt
"""


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_chain_ids_follow_the_image_spec():
    one, two, three = sha("a"), sha("b"), sha("c")
    second = sha(f"{one} {two}")
    assert delivery.chain_ids([one, two, three]) == [one, second, sha(f"{second} {three}")]
    assert delivery.chain_ids([]) == []


def test_a_layer_is_skipped_only_where_the_daemon_holds_it_at_every_position():
    one, two = sha("a"), sha("b")
    held = set(delivery.chain_ids([one, two]))
    assert delivery.layers_to_skip([one, two, sha("new")], held) == {one, two}
    # `one` again on top of the new layer: that chain is unknown to the daemon, so `one` must travel.
    assert delivery.layers_to_skip([one, sha("new"), one], held) == set()
    assert delivery.layers_to_skip([sha("x"), two], held) == set()  # same diff_id, other parent


def build(engine: BuildahEngine, context: Path, tag: str, note: str):
    (context / "note.txt").write_text(note)
    return engine.build(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,),
                                     source_date_epoch=EPOCH, network="none"))


@pytest.mark.engine
def test_a_layer_the_daemon_lacks_makes_the_partial_copy_fail_and_the_build_copy_it_all(base_image, tmp_path,
                                                                                          monkeypatch):
    """Claiming the daemon holds a layer it does not: docker load refuses the archive (nothing is
    tagged), and the engine's delivery falls back to the full copy."""
    context = write_context(tmp_path / "ctx", DOCKERFILE)
    engine, daemon = BuildahEngine(export_to_docker=False), DockerDaemon()
    tag = "localhost/delivery-test:lied"
    try:
        built = build(engine, context, tag, "lied\n")
        info = engine.inspect(tag)
        diff_ids = [layer.diff_id for layer in info.layers]
        blobs = engine._layout_root() / "blobs" / "sha256"
        with pytest.raises(BuildFailure, match="docker load failed"):
            delivery.deliver_from_layout(blobs, info.config_bytes, diff_ids, {diff_ids[1]}, tag, daemon.load_stream)
        assert daemon.image_id(tag) is None

        monkeypatch.setattr(delivery, "layers_to_skip", lambda ids, held: {diff_ids[1]})
        moved = BuildahEngine()._deliver(info, tag)
        assert daemon.image_id(tag) == built.image_id
        assert moved == sum(layer.size for layer in info.layers)  # the full copy's count
    finally:
        BuildahEngine().remove(tag)


@pytest.mark.engine
def test_an_image_only_the_storage_holds_goes_whole_through_buildah(base_image, tmp_path):
    """The engine's own image (its RUN layer is not the builder's bytes, so the daemon lacks it) is not in
    the write-once layout: it goes whole, through `buildah push`."""
    context = write_context(tmp_path / "ctx", DOCKERFILE, {"note.txt": "stored\n"})
    engine, daemon = BuildahEngine(storage_dir=tmp_path / "storage", export_to_docker=False), DockerDaemon()
    tag = "localhost/delivery-test:stored-only"
    engine.load(base_image.archive)
    native_id = engine.build_native(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,),
                                                 source_date_epoch=EPOCH, network="none"))
    info = engine.inspect(native_id)
    try:
        moved = BuildahEngine(storage_dir=tmp_path / "storage")._deliver(info, tag)
        assert daemon.image_id(tag) == native_id
        assert moved == sum(layer.size for layer in info.layers) > BIG
    finally:
        daemon.remove(tag)
        discard_storage(engine, engine.storage_dir)
