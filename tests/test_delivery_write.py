"""`--load` of a written image: the layers go from the write-once layout straight into the Docker daemon,
only those it lacks, with the image id kept; a daemon that refuses them is one line and moves no tag
(real buildah, real daemon)."""

import subprocess

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import DockerDaemon
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure

BIG = 4_000_000  # bytes of the layer a second delivery must not move again

DOCKERFILE = f"""\
FROM {TEST_BASE_TAG}
RUN ["sh", "-c", "head -c {BIG} /dev/zero | tr '\\\\0' x > /big"]
COPY note.txt /note.txt
"""


def write(engine: BuildahEngine, context, tag: str, note: str):
    (context / "note.txt").write_text(note)
    return engine.build(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,),
                                     source_date_epoch=EPOCH, network="none"))


def no_push(*args, **kwargs):
    raise AssertionError("a written image was delivered through a buildah push")


@pytest.mark.engine
def test_a_written_image_goes_from_the_layout_into_the_daemon_with_its_id(base_image, tmp_path, monkeypatch):
    monkeypatch.setattr(BuildahEngine, "_deliver_through_push", no_push)
    context = write_context(tmp_path / "ctx", DOCKERFILE)
    engine, daemon = BuildahEngine(), DockerDaemon()
    tags = ("localhost/delivery-write:one", "localhost/delivery-write:two")
    try:
        first = write(engine, context, tags[0], "one\n")
        second = write(engine, context, tags[1], "two\n")

        assert first.delivered_bytes > BIG  # the daemon had no image with the big layer
        assert 0 < second.delivered_bytes < 100_000  # only the note's layer
        assert [daemon.image_id(tag) for tag in tags] == [first.image_id, second.image_id]
        shown = subprocess.run(["docker", "run", "--rm", tags[1], "sh", "-c", "cat /note.txt; wc -c < /big"],
                               capture_output=True, text=True, check=True).stdout.split()
        assert shown == ["two", str(BIG)]
    finally:
        for tag in tags:
            engine.remove(tag)


@pytest.mark.engine
def test_a_daemon_that_refuses_the_layers_fails_the_build_in_one_line_and_moves_no_tag(base_image, tmp_path,
                                                                                        monkeypatch):
    context = write_context(tmp_path / "ctx", DOCKERFILE)
    engine, daemon = BuildahEngine(), DockerDaemon()
    tag = "localhost/delivery-write:refused"
    try:
        before = write(engine, context, tag, "before\n")

        def refuse(self, stream):
            stream.read(1 << 16)
            raise BuildFailure("docker load failed: write /var/lib/docker/tmp/x: no space left on device")

        monkeypatch.setattr(DockerDaemon, "load_stream", refuse)
        with pytest.raises(BuildFailure, match="no space left on device") as failure:
            write(engine, context, tag, "after\n")
        assert "\n" not in str(failure.value)
        assert engine.inspect(tag).image_id == before.image_id  # buildah's tag put back
        assert daemon.image_id(tag) == before.image_id  # and the daemon's never moved
    finally:
        engine.remove(tag)
