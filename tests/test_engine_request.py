"""BuildRequest validation and the engines' argument lists (no engine needed)."""

from pathlib import Path

import pytest

from builder.engine import ENGINE_NAMES, get_engine
from builder.engine.protocol import BuildRequest, check_request_inputs, layers_from_history
from builder.engine.buildah import BuildahEngine, base_image_refs
from builder.engine.docker import BuildKitClient, DockerEngine
from builder.errors import UserError


def request(**overrides):
    values = dict(
        context_dir="ctx", dockerfile="ctx/Dockerfile", tags=["localhost/x:1"],
        source_date_epoch=1735689600,
    )
    values.update(overrides)
    return BuildRequest(**values)


def test_request_is_frozen_and_sorted():
    built = request(build_args={"b": "2", "a": "1"}, labels={"z": "1", "m": "2"})
    assert list(built.build_args) == ["a", "b"]
    assert list(built.labels) == ["m", "z"]
    assert built.tags == ("localhost/x:1",)
    with pytest.raises(TypeError):
        built.build_args["c"] = "3"
    with pytest.raises(AttributeError):
        built.no_cache = True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tags": []}, "build request has no tag"),
        ({"source_date_epoch": "1735689600"}, "SOURCE_DATE_EPOCH must be an integer, got '1735689600'"),
        ({"source_date_epoch": True}, "SOURCE_DATE_EPOCH must be an integer"),
        ({"source_date_epoch": -1}, "SOURCE_DATE_EPOCH must not be negative, got -1"),
        ({"add_hosts": ["no-address"]}, "bad host entry 'no-address': expected NAME:IP"),
        ({"add_hosts": ["a b:1.2.3.4"]}, "bad host entry 'a b:1.2.3.4'"),
        ({"secrets": {"ca cert": "/x"}}, "bad secret id 'ca cert'"),
    ],
)
def test_bad_requests_say_what_is_wrong(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        request(**overrides)


def test_missing_inputs_are_named(tmp_path):
    with pytest.raises(UserError, match=f"build context {tmp_path / 'nope'} is not a directory"):
        check_request_inputs(request(context_dir=tmp_path / "nope"))
    with pytest.raises(UserError, match=f"Dockerfile {tmp_path / 'Dockerfile'} not found"):
        check_request_inputs(request(context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile"))
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(UserError, match="secret cacert: file /nonexistent/ca.crt not found"):
        check_request_inputs(request(
            context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile",
            secrets={"cacert": "/nonexistent/ca.crt"},
        ))


def test_buildah_command_is_reproducible_and_complete():
    built = request(
        build_args={"PY": "3.11"}, labels={"org.opencontainers.image.version": "0.5.9"},
        add_hosts=["index.internal:192.0.2.10"], secrets={"cacert": "/etc/ca.crt"},
        network="host", no_cache=True, target="runtime",
    )
    argv = BuildahEngine().build_command(built, Path("/tmp/iid"))
    assert argv[:2] == ["buildah", "build"]
    joined = " ".join(argv)
    for expected in [
        "--timestamp 1735689600", "--identity-label=false", "--format oci", "--layers",
        "--pull=never", "--no-cache", "--target runtime", "--network host",
        "--build-arg PY=3.11", "--build-arg SOURCE_DATE_EPOCH=1735689600",
        "--label org.opencontainers.image.version=0.5.9", "--add-host index.internal:192.0.2.10",
        "--secret id=cacert,src=/etc/ca.crt", "--iidfile /tmp/iid", "--file ctx/Dockerfile",
    ]:
        assert expected in joined
    assert argv[-1] == "ctx"
    # Tags are applied only after a successful build (never by the build command itself).
    assert "-t" not in argv and "--tag" not in argv


def test_buildah_private_storage_arguments(tmp_path):
    argv = BuildahEngine(storage_dir=tmp_path).build_command(request(), Path("/tmp/iid"))
    assert argv[:7] == [
        "buildah", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run"),
        "--storage-driver", "overlay",
    ]


def test_buildah_refuses_to_empty_shared_storage():
    with pytest.raises(UserError, match="refusing to empty buildah's shared storage"):
        BuildahEngine().reset_storage()


def test_docker_command_uses_buildkit():
    built = request(secrets={"cacert": "/etc/ca.crt"}, add_hosts=["a.b:192.0.2.1"])
    legacy = DockerEngine(client=BuildKitClient("/usr/bin/docker", buildx=False))
    argv, env = legacy.build_command(built, Path("/tmp/iid"))
    assert argv[:2] == ["/usr/bin/docker", "build"] and env["DOCKER_BUILDKIT"] == "1"
    assert "--secret" in argv and "id=cacert,src=/etc/ca.crt" in argv
    assert "--progress=plain" in argv
    buildx = DockerEngine(client=BuildKitClient("/usr/bin/docker", buildx=True))
    argv, _ = buildx.build_command(built, Path("/tmp/iid"))
    assert argv[:4] == ["/usr/bin/docker", "buildx", "build", "--load"]


def test_unknown_engine_lists_the_choices():
    with pytest.raises(UserError, match="unknown engine 'podman': choose one of buildah, docker"):
        get_engine("podman")
    assert get_engine().name == "buildah" and ENGINE_NAMES == ("buildah", "docker")


def test_layers_pair_with_the_steps_that_made_them():
    history = [
        {"created_by": "base"},
        {"created_by": "ENV A=1", "empty_layer": True},
        {"created_by": "RUN make"},
    ]
    layers = layers_from_history(["sha256:a", "sha256:b"], history, [10, 20])
    assert [(l.diff_id, l.size, l.created_by) for l in layers] == [
        ("sha256:a", 10, "base"), ("sha256:b", 20, "RUN make"),
    ]
    # Without a matching history the steps stay unknown rather than wrong.
    unknown = layers_from_history(["sha256:a"], history, [None])
    assert unknown[0].created_by == ""


def test_base_image_refs_follow_args_and_skip_stages():
    dockerfile = """\
ARG BASE=localhost/builder-base:bookworm
ARG CUDA
FROM ${BASE} AS build
RUN make
FROM --platform=linux/amd64 build AS final
FROM scratch
FROM nvidia/cuda:${CUDA}-devel
FROM $BASE
"""
    assert base_image_refs(dockerfile, {}) == ["localhost/builder-base:bookworm"]
    assert base_image_refs(dockerfile, {"CUDA": "13.0.1", "BASE": "localhost/other:1"}) == [
        "localhost/other:1", "nvidia/cuda:13.0.1-devel"]
