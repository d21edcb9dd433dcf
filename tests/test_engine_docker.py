"""The Docker backend on the real daemon: BuildKit through the CLI, secrets and host entries,
failures that name the step, and (documented) no bit-reproducibility on Docker 20.10."""

import subprocess

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine.protocol import BuildRequest
from builder.engine.docker import DockerEngine, find_buildkit_client
from builder.errors import BuildFailure, UserError
from builder.engine.host_network import host_network

pytestmark = pytest.mark.engine


def test_a_buildkit_capable_cli_is_found():
    client = find_buildkit_client()
    assert client is not None
    if not client.buildx:
        version = subprocess.run([client.docker, "version", "--format", "{{.Client.Version}}"],
                                 capture_output=True, text=True, check=True).stdout
        assert int(version.split(".")[0]) < 23


def test_no_buildkit_cli_is_a_one_line_error(tmp_path, monkeypatch):
    # A PATH holding no docker CLI at all: nothing to drive BuildKit with.
    assert find_buildkit_client(path=str(tmp_path)) is None
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match=r"^no docker CLI with BuildKit found: install docker-buildx"):
        DockerEngine()._buildkit()


def test_build_with_secret_and_host_entry(base_image, tmp_path):
    context = write_context(tmp_path / "ctx", f"""\
FROM {TEST_BASE_TAG}
RUN --mount=type=secret,id=cacert test -s /run/secrets/cacert \\
 && getent hosts docker-test.invalid > /host-seen && echo ok > /secret-seen
ENV MARK=1
""")
    network = host_network()
    tag = "localhost/engine-docker-test:1"
    engine = DockerEngine()
    lines = []
    result = engine.build(BuildRequest(
        context_dir=context, dockerfile=context / "Dockerfile", tags=[tag], source_date_epoch=EPOCH,
        secrets=network.secrets, add_hosts=("docker-test.invalid:192.0.2.77",),
        labels={"org.opencontainers.image.version": "1"}, progress=lines.append,
    ))
    try:
        assert any("[2/2] RUN --mount=type=secret,id=cacert" in line for line in lines)
        assert engine.image_id(tag) == result.image_id
        info = engine.inspect(tag)
        assert info.labels["org.opencontainers.image.version"] == "1"
        assert len(info.layers) == 2 and "getent hosts docker-test.invalid" in info.layers[1].created_by
        seen = subprocess.run(["docker", "run", "--rm", tag, "cat", "/host-seen", "/secret-seen"],
                              capture_output=True, text=True, check=True).stdout
        assert seen.split() == ["192.0.2.77", "docker-test.invalid", "ok"]
        secret_left = subprocess.run(["docker", "run", "--rm", tag, "ls", "/run/secrets"],
                                     capture_output=True, text=True)
        assert secret_left.stdout.strip() == ""
    finally:
        engine.remove(tag)
    assert not engine.exists(tag)


def test_failed_step_names_the_step_and_tags_nothing(base_image, tmp_path):
    context = write_context(tmp_path / "ctx", f"FROM {TEST_BASE_TAG}\nRUN echo docker-boom && exit 4\n")
    tag = "localhost/engine-docker-fail:1"
    with pytest.raises(BuildFailure) as failure:
        DockerEngine().build(BuildRequest(
            context_dir=context, dockerfile=context / "Dockerfile", tags=[tag], source_date_epoch=EPOCH))
    message = str(failure.value)
    assert message.splitlines()[0].startswith(f"docker build of {tag} failed at #")
    assert "[2/2] RUN echo docker-boom && exit 4" in message.splitlines()[0]
    assert "docker-boom" in message
    assert not DockerEngine().exists(tag)


def test_docker_20_10_builds_are_not_reproducible(base_image, tmp_path):
    """Why buildah is the default: the same inputs, two digests (wall-clock times in the config)."""
    engine = DockerEngine()
    if engine._buildkit().buildx:
        pytest.skip("buildx present: reproducibility depends on its BuildKit version")
    context = write_context(tmp_path / "ctx", f"FROM {TEST_BASE_TAG}\nRUN echo same > /same\n")
    ids = []
    for run in (1, 2):
        tag = f"localhost/engine-docker-repro:{run}"
        ids.append(engine.build(BuildRequest(
            context_dir=context, dockerfile=context / "Dockerfile", tags=[tag],
            source_date_epoch=EPOCH, no_cache=True)).image_id)
        engine.remove(tag)
    assert engine.reproducible is False
    assert ids[0] != ids[1]


def test_the_daemon_is_the_container_api_and_holds_what_it_built(image, monkeypatch):
    """What smoke_host and push ask of the docker engine: its images run in the daemon itself (no service
    of its own for the watchdog to stop), and it holds exactly what the daemon holds."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    engine = DockerEngine()
    with engine.container_api() as api:
        assert api.client.images.get(image["id"]).id == image["id"]
        assert api.url == "unix:///var/run/docker.sock" and api.service_pid is None
    assert engine.holds(image["id"]) and not engine.holds("localhost/no-such-image:0")
    assert engine.docker_loader() is None


def test_an_unreachable_daemon_holds_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    assert DockerEngine().holds("anything:1") is False
