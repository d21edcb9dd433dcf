"""`builder smoke`: the host side runs the in-image program through the Docker SDK."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.errors import BuildFailure, UserError
from builder.runtime.smoke import report as smoke_report
from builder.smoke import smoke_gate
from engine_helpers import TEST_BASE_TAG

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = TEST_BASE_TAG


def test_gpus_all_is_a_device_request_for_every_gpu():
    [request] = smoke_gate.device_requests("all")
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert smoke_gate.device_requests("2")[0]["Count"] == 2
    assert smoke_gate.device_requests(None) == []


@pytest.mark.parametrize("value", ["two", "0", "-1", ""])
def test_bad_gpus_value_is_a_usage_error(value):
    with pytest.raises(UserError, match="--gpus takes 'all' or a positive number"):
        smoke_gate.device_requests(value)


def test_report_round_trips_through_json():
    results = [smoke_report.passed("versions.torch", "torch 2.9.1"),
               smoke_report.failed("abi.cxx11", "mismatch"),
               smoke_report.skipped("gpu.matmul", "no GPU visible")]
    text = smoke_report.to_json("s", results)
    assert json.loads(text)["ok"] is False
    assert json.loads(text)["summary"] == {"fail": 1, "pass": 1, "skip": 1}
    assert smoke_report.from_json(text) == ("s", results)
    table = smoke_report.format_table("s", results)
    assert "abi.cxx11       FAIL    mismatch" in table
    assert table.endswith("1 passed, 1 failed, 1 skipped\n")
    with pytest.raises(ValueError, match="not a smoke report"):
        smoke_report.from_json('{"schema": 7}')


@pytest.fixture
def docker_client(base_image):
    import docker

    return docker.from_env()


@pytest.fixture(scope="module")
def smoke_image(tmp_path_factory, base_image):
    """A small real image: Debian's python3 as /opt/venv/bin/python, the runtime, a stack.json."""
    import docker

    client = docker.from_env()
    context = tmp_path_factory.mktemp("context")
    shutil.copytree(REPO / "builder" / "runtime", context / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stack = {"schema": 2, "stack": "smoke-engine-test", "cuda": "13.0.1", "python": "3.11", "replaces": None,
             "driver": {"cuda": "13.0.1", "minimum": "580.82.07", "source": "NVIDIA CUDA Toolkit release notes"},
             "target_arch": ["12.0"], "venv": "/opt/venv", "distributions": {"torch": "2.9.1"},
             "patches": [], "serve": {"env": {}, "cache_dir": "/cache", "modes": {}},
             "bench": {"input_len": 1, "output_len": 1, "num_prompts": 1,
                       "regression_tolerance": 0.05}, "overrides": []}
    (context / "stack.json").write_text(json.dumps(stack))
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "RUN mkdir -p /opt/venv/bin && ln -s /usr/bin/python3 /opt/venv/bin/python\n"
        "COPY runtime /opt/builder/runtime\n"
        "COPY stack.json /opt/builder/stack.json\n")
    image, _ = client.images.build(path=str(context), tag="localhost/smoke-engine-test:1",
                                   rm=True)
    yield image.tags[0]
    client.images.remove(image.id, force=True)


@pytest.mark.engine
def test_smoke_in_a_real_container_reports_failures(smoke_image, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = main(["smoke", smoke_image, "--only", "versions", "patches", "--json", str(report)])
    captured = capsys.readouterr()
    assert code == 1
    assert re.search(r"^versions\.torch +FAIL +torch is not installed \(pinned 2\.9\.1\)$",
                     captured.out, re.M)
    assert "builder: error: smoke checks failed in localhost/smoke-engine-test:1: " \
           "versions.torch, versions.torch-cuda" in captured.err
    written = json.loads(report.read_text())
    assert written["stack"] == "smoke-engine-test" and written["ok"] is False


@pytest.mark.engine
def test_smoke_in_a_real_container_passes(smoke_image, capsys):
    assert main(["smoke", smoke_image, "--only", "patches"]) == 0
    assert re.search(r"^patches +SKIP +the stack has no patches$", capsys.readouterr().out, re.M)


@pytest.mark.engine
def test_report_object_for_builder_build(smoke_image, docker_client):
    report = smoke_gate.run_in_image(smoke_image, only=["versions"], client=docker_client)
    assert report.passed is False and report.failures() == ["versions.torch",
                                                            "versions.torch-cuda"]
    as_dict = report.to_dict()
    assert as_dict["passed"] is False and as_dict["stack"] == "smoke-engine-test"
    assert as_dict["results"][0] == {"check": "versions.torch", "status": "fail",
                                     "detail": "torch is not installed (pinned 2.9.1)"}
    assert report.table().startswith("smoke checks for smoke-engine-test (localhost/")


@pytest.mark.engine
def test_image_without_the_program_is_a_build_failure(docker_client):
    with pytest.raises(BuildFailure, match=f"smoke checks could not run in {BASE_IMAGE}"):
        smoke_gate.run_in_image(BASE_IMAGE, client=docker_client)


@pytest.mark.engine
def test_missing_image_is_one_clear_line(capsys, docker_client):
    assert main(["smoke", "localhost/no-such-image:0"]) == 2
    assert capsys.readouterr().err == "builder: error: image localhost/no-such-image:0 not found\n"


def test_a_podman_that_does_not_start_fails_the_run_where_it_needs_the_api(tmp_path, monkeypatch):
    """The service starts beside the build's own work; what stops it is one line at `ready()`, which the
    build asks for before any tag moves, and leaving the host then raises nothing more."""
    from builder.engine.buildah import BuildahEngine
    from builder.engine.progress import Progress
    from builder.smoke import smoke_host

    stand_in = tmp_path / "podman"
    stand_in.write_text("#!/bin/sh\necho 'Error: storage is locked by a ghost' >&2\nexit 125\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with smoke_host.open_host(BuildahEngine(export_to_docker=False), Progress(io.StringIO(), interactive=False)) \
            as host:
        with pytest.raises(UserError, match=r"^podman system service did not start: Error: storage is locked by "
                                            r"a ghost$"):
            host.ready()
        with pytest.raises(UserError, match="did not start"):
            host.client  # noqa: B018 - the client is behind the same wait


@pytest.mark.engine
def test_a_containers_exit_status_comes_through_either_api(docker_client):
    """exit_status asks for the container's state instead of calling the API's wait, which podman 4.3
    answers by polling every microsecond: both the Docker daemon and podman's service give the code."""
    from builder.engine.buildah import BuildahEngine
    from builder.engine.container_exit import exit_status
    from builder.engine.container_limits import own_ulimits
    from builder.engine.progress import Progress
    from builder.smoke import smoke_host

    with smoke_host.open_host(BuildahEngine(export_to_docker=False), Progress(io.StringIO(), interactive=False)) \
            as host:
        for client, labels in ((docker_client, {}), (host.client, host.labels())):
            container = client.containers.create(BASE_IMAGE, ["-c", "sleep 1; exit 3"], entrypoint=["/bin/sh"],
                                                 labels=labels, ulimits=own_ulimits(), network_disabled=True)
            try:
                container.start()
                assert exit_status(container, poll_s=0.05) == 3
            finally:
                container.remove(force=True)
