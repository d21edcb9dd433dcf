"""The buildah backend on the real engine, building as `builder build` does (the builder writes each layer,
buildah hands over the base and its storage): reproducible clean builds, delivery into the Docker daemon,
failures that name the step, no tag left behind by a failure or by Ctrl-C."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import DockerDaemon
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure, UserError
from builder.oci.layer_diff import build_twice

pytestmark = pytest.mark.engine

DETERMINISTIC = f"""\
FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
RUN ["python3", "-m", "venv", "/opt/venv"]
COPY app.py /opt/app/app.py
RUN ["/bin/sh", "-c", "/opt/venv/bin/python -m compileall -q /opt/app && echo built > /opt/app/state"]
ENV APP_HOME=/opt/app
LABEL org.opencontainers.image.version=1
"""


def test_two_clean_builds_give_the_same_digest(base_image, tmp_path):
    context = write_context(tmp_path / "ctx", DETERMINISTIC, {"app.py": "print('hello')\n"})
    built = BuildRequest(
        context_dir=context, dockerfile=context / "Dockerfile",
        tags=["localhost/engine-test-repro:1"], source_date_epoch=EPOCH,
    )
    two = build_twice(built, (base_image.archive,), tmp_path / "verify", BuildahEngine())
    assert two.image_ids[0] == two.image_ids[1]
    assert two.archives[0].read_bytes() == two.archives[1].read_bytes()
    # Each build ran in its own storage, removed afterwards: nothing of them is left.
    assert sorted(p.name for p in (tmp_path / "verify").iterdir()) == [
        "build-1.docker.tar", "build-2.docker.tar"]


def test_build_lands_in_the_docker_daemon_with_the_same_id(base_image, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))  # a cold layer cache: every layer is written
    context = write_context(tmp_path / "ctx", DETERMINISTIC, {"app.py": "print('hello')\n"})
    tags = ["localhost/engine-test-deliver:1", "localhost/engine-test-deliver:moving"]
    engine = BuildahEngine()
    lines = []
    result = engine.build(BuildRequest(
        context_dir=context, dockerfile=context / "Dockerfile", tags=tags, source_date_epoch=EPOCH,
        progress=lines.append,
    ))
    try:
        # The builder wrote the three layers above the base itself, and said so (after the layer cache's line).
        assert [line.split(":")[0] for line in lines if line.startswith("layer ")][1:] == ["layer 2", "layer 3", "layer 4"]
        daemon = DockerDaemon()
        assert daemon.image_id(tags[0]) == daemon.image_id(tags[1]) == result.image_id
        info = engine.inspect(tags[0])
        assert info.image_id == result.image_id
        assert info.labels["org.opencontainers.image.version"] == "1"
        assert info.created == "2025-01-01T00:00:00Z"
        assert [layer.created_by.split("/bin/sh -c ")[-1] for layer in result.layers[1:]] == [
            '["python3", "-m", "venv", "/opt/venv"]',
            "#(nop) COPY file in /opt/app/app.py ",  # canonical: no engine-computed source digest
            '["/bin/sh", "-c", "/opt/venv/bin/python -m compileall -q /opt/app && echo built > /opt/app/state"]',
        ], [layer.created_by for layer in result.layers]
        assert all(layer.size and layer.size > 0 for layer in result.layers)
        run = subprocess.run(
            ["docker", "run", "--rm", tags[0], "/opt/venv/bin/python", "/opt/app/app.py"],
            capture_output=True, text=True, check=True,
        )
        assert run.stdout == "hello\n"
    finally:
        for tag in tags:
            engine.remove(tag)
    assert not engine.exists(tags[0]) and DockerDaemon().image_id(tags[0]) is None


def test_failed_step_is_named_with_its_output_and_moves_no_tag(base_image, tmp_path):
    engine = BuildahEngine()
    tag = "localhost/engine-test-fail:1"
    good = write_context(tmp_path / "good", f"FROM {TEST_BASE_TAG}\nRUN [\"/bin/sh\", \"-c\", \"echo good > /good\"]\n")
    bad = write_context(tmp_path / "bad", f"FROM {TEST_BASE_TAG}\n"
                        'RUN ["/bin/sh", "-c", "echo boom-marker-1 && echo boom-marker-2 && exit 3"]\n')
    previous = engine.build(BuildRequest(
        context_dir=good, dockerfile=good / "Dockerfile", tags=[tag], source_date_epoch=EPOCH))
    try:
        with pytest.raises(BuildFailure) as failure:
            engine.build(BuildRequest(
                context_dir=bad, dockerfile=bad / "Dockerfile", tags=[tag], source_date_epoch=EPOCH))
        message = str(failure.value)
        first_line = message.splitlines()[0]
        assert first_line == "RUN at Dockerfile line 2 failed (exit status 3); last output:"
        assert "  | boom-marker-1" in message and "  | boom-marker-2" in message
        assert engine.image_id(tag) == previous.image_id
        assert DockerDaemon().image_id(tag) == previous.image_id
    finally:
        engine.remove(tag)


def test_missing_base_image_fails_without_pulling(tmp_path):
    context = write_context(tmp_path / "ctx", 'FROM localhost/builder-no-such-base:1\nRUN ["true"]\n')
    with pytest.raises(BuildFailure, match="localhost/builder-no-such-base:1"):
        BuildahEngine().build(BuildRequest(
            context_dir=context, dockerfile=context / "Dockerfile",
            tags=["localhost/engine-test-nobase:1"], source_date_epoch=EPOCH))


def test_docker_daemon_not_running_says_how_to_start_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(UserError) as error:
        BuildahEngine().check()
    assert str(error.value).startswith("Docker daemon not running (")
    assert str(error.value).endswith(
        "start it with scripts/setup-host (or run `dockerd &` as root)")


def test_buildah_missing_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match=r"^buildah not found: install it with scripts/setup-host"):
        BuildahEngine(export_to_docker=False).check()


def test_ctrl_c_leaves_no_tag_and_no_container(base_image, tmp_path):
    storage = tmp_path / "storage"
    engine = BuildahEngine(storage_dir=storage, export_to_docker=False)
    engine.load(base_image.archive)
    context = write_context(
        tmp_path / "ctx", f'FROM {TEST_BASE_TAG}\nRUN ["/bin/sh", "-c", "echo step-started && sleep 120"]\n')
    script = textwrap.dedent(f"""
        import signal
        import sys
        from pathlib import Path
        # A terminal's foreground process has Python's Ctrl-C handler; a child of a shell that ignores
        # SIGINT (a CI runner's background job) would inherit SIG_IGN, and only buildah would stop.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from builder.engine.protocol import BuildRequest
        from builder.engine.buildah import BuildahEngine
        engine = BuildahEngine(storage_dir=Path({str(storage)!r}), export_to_docker=False)
        request = BuildRequest(context_dir={str(context)!r}, dockerfile={str(context / 'Dockerfile')!r},
            tags=["localhost/engine-test-interrupt:1"], source_date_epoch={EPOCH},
            progress=lambda line: print(line, flush=True))
        try:
            engine.build(request)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """)
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), start_new_session=True,
    )
    try:
        for line in process.stdout:
            if line.strip() == "step-started":
                break
        # Ctrl-C reaches the whole foreground process group: the builder and buildah alike.
        os.killpg(process.pid, signal.SIGINT)
        rest = process.stdout.read()
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "interrupted" in rest
    assert not engine.exists("localhost/engine-test-interrupt:1")
    containers = subprocess.run(
        engine._global_args() + ["containers", "--quiet"], capture_output=True, text=True, check=True)
    assert containers.stdout.strip() == ""
    engine.reset_storage()


def test_base_with_several_names_is_refused(base_image, tmp_path):
    engine = BuildahEngine(storage_dir=tmp_path / "storage", export_to_docker=False)
    engine.load(base_image.archive)
    try:
        subprocess.run(engine._global_args() + ["tag", TEST_BASE_TAG, "localhost/second-name:1"],
                       check=True, capture_output=True)
        context = write_context(tmp_path / "ctx", f"FROM {TEST_BASE_TAG}\nRUN true\n")
        with pytest.raises(UserError) as error:  # the engine's own build records the name it builds FROM
            engine.build_native(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile",
                                             tags=["localhost/engine-test-names:1"], source_date_epoch=EPOCH))
        assert str(error.value) == (
            f"base image {TEST_BASE_TAG} also has the names localhost/second-name:1: the digest would "
            "depend on which name buildah records; remove the extra names (buildah rmi NAME)")
    finally:
        engine.reset_storage()


def test_buildah_that_is_not_installed_holds_nothing(tmp_path):
    """`builder smoke` and `builder push` ask holds() where buildah may be missing: an answer, not a traceback."""
    assert BuildahEngine(command=[str(tmp_path / "no-buildah")], export_to_docker=False).holds("anything:1") is False


def test_a_private_storage_is_the_same_buildah_delivering_nowhere(tmp_path):
    host = BuildahEngine(command=["buildah", "--log-level=error"])
    fresh = host.private_storage(tmp_path / "storage")
    assert (fresh.storage_dir, fresh.command, fresh.export_to_docker) == (tmp_path / "storage", host.command, False)
    assert fresh.docker_loader().export_to_docker and fresh.docker_loader().storage_dir == tmp_path / "storage"
