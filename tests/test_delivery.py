"""Delivery into the Docker daemon moves only the layers it lacks (real buildah, real daemon)."""

import hashlib
import subprocess
import tempfile
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine import delivery
from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import DockerDaemon
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure

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
def test_a_changed_top_layer_moves_only_that_layer(base_image, tmp_path):
    context = write_context(tmp_path / "ctx", DOCKERFILE)
    engine, daemon = BuildahEngine(), DockerDaemon()
    first_tag, second_tag = "localhost/delivery-test:one", "localhost/delivery-test:two"
    try:
        first = build(engine, context, first_tag, "one\n")
        second = build(engine, context, second_tag, "two\n")

        assert first.delivered_bytes > BIG  # the daemon had no image with the big layer: it all moved
        assert 0 < second.delivered_bytes < 100_000  # only the note's layer
        assert daemon.image_id(second_tag) == second.image_id  # the config travelled byte for byte
        shown = subprocess.run(["docker", "run", "--rm", second_tag, "sh", "-c", "cat /note.txt; wc -c < /big"],
                               capture_output=True, text=True, check=True).stdout.split()
        assert shown == ["two", str(BIG)]
    finally:
        for tag in (first_tag, second_tag):
            engine.remove(tag)


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
        with pytest.raises(BuildFailure, match="docker load failed"):
            delivery.deliver_new_layers(["buildah"], built.image_id, diff_ids, {diff_ids[1]}, tag,
                                        daemon.load_stream, Path(tempfile.gettempdir()))
        assert daemon.image_id(tag) is None

        monkeypatch.setattr(delivery, "layers_to_skip", lambda ids, held: {diff_ids[1]})
        moved = BuildahEngine()._deliver(info, tag)
        assert daemon.image_id(tag) == built.image_id
        assert moved == sum(layer.size for layer in info.layers)  # the full copy's count
    finally:
        BuildahEngine().remove(tag)
