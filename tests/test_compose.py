"""images/<stack>/compose.yaml: every committed one is valid for Docker Compose v2 (`config`, which
checks the compose specification's schema and every value), and holds what a GPU host needs: one
service per serve mode under its own profile, all GPUs, host IPC, ulimits, the mounts and the port from
variables, a stop grace period and the entrypoint's own health check; and an image reference that no
build or push changes (the moving tag), so the committed file stays current."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from builder.config.matrix import load_matrix
from builder.lock import records, store
from builder.lock.model import ImageRecord, LockedBase, PushRecord
from builder.lock.resolution import lock_stacks
from builder.render import render
from builder.render.compose import STOP_MARGIN_S, STOP_TIMEOUT_S
from checkouts import REPO
from compose_tools import compose_binary
from lock_values import base_digest_of, resolution_of, smoke_report, system_packages_of

MATRIX = load_matrix(REPO / "matrix.toml")
COMPOSE_FILES = sorted((REPO / "images").glob("*/compose.yaml"))
DIGEST = "sha256:" + "a" * 64
IMAGE_ID = "sha256:" + "b" * 64


def compose_config(path: Path, *profiles: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`docker compose config` as JSON, with only `env` as the environment (no variable from this shell)."""
    flags = [word for profile in profiles for word in ("--profile", profile)]
    return subprocess.run([str(compose_binary()), "-f", str(path), "-p", "check", *flags, "config", "--format", "json"],
                          capture_output=True, text=True, env=env or {}, cwd=path.parent)


def test_every_row_has_a_committed_compose_file():
    assert [p.parent.name for p in COMPOSE_FILES] == sorted(row.name for row in MATRIX.all_rows())


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.parent.name)
def test_committed_compose_file_is_valid_and_serves_every_mode(path):
    stack = MATRIX.stack(path.parent.name)
    modes = [mode.name for mode in stack.serve.modes]
    result = compose_config(path, *modes)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert sorted(services) == sorted(modes)
    image = f"sglang:{stack.name.removeprefix('sglang-')}"
    for mode in stack.serve.modes:
        service = services[mode.name]
        assert service["profiles"] == [mode.name] and service["image"] == image
        assert service["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}]  # -1: compose's "all"
        assert service["ipc"] == "host"
        assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
        expected_env = {**stack.serve.env, **mode.env, "ENTRYPOINT_STOP_TIMEOUT": str(STOP_TIMEOUT_S),
                        "SERVE_API_KEY": ""}  # no key unless the host's environment sets one
        assert service["environment"] == {name: str(value) for name, value in expected_env.items()}
        # The variables' defaults: the README's `docker run -v /models:/models -v /cache:/cache -p 30000:30000`.
        assert [(v["source"], v["target"], v.get("read_only", False)) for v in service["volumes"]] == [
            ("/models", "/models", True), ("/cache", stack.serve.cache_dir, False)]
        # Published on the host's loopback only, unless SERVE_BIND says otherwise.
        assert [(p["host_ip"], p["published"], p["target"]) for p in service["ports"]] == [("127.0.0.1", "30000", 30000)]
        assert service["command"][:5] == ["serve", "--mode", mode.name, "--model", "/models/model"]
        assert ("--draft-model" in service["command"]) == mode.requires_draft_model
        # compose reports durations in its own spelling: 1m30s is 90 s
        assert service["stop_grace_period"] == "1m30s" and STOP_TIMEOUT_S + STOP_MARGIN_S == 90
        check = service["healthcheck"]
        assert check["test"] == ["CMD", "/opt/venv/bin/python", "-m", "builder.runtime.serve.entrypoint",
                                 "health", "--port", "30000", "--timeout", "5"]
        assert check["start_period"] == "1h0m0s"  # the entrypoint's own cap on starting


def test_no_profile_starts_nothing():
    """`docker compose up` without --profile must not start four servers fighting over the GPUs."""
    path = REPO / "images/sglang-0.5.9-cu130/compose.yaml"
    result = compose_config(path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["services"] == {}


def test_variables_move_the_mounts_the_models_and_the_port():
    path = REPO / "images/sglang-0.5.9-cu130/compose.yaml"
    env = {"SERVE_MODELS_DIR": "/srv/models", "SERVE_CACHE_DIR": "/srv/cache", "SERVE_PORT": "31000",
           "SERVE_MODEL": "/models/Kimi-K2.5", "SERVE_DRAFT_MODEL": "/models/Kimi-K2.5-eagle3",
           "SERVE_BIND": "0.0.0.0", "SERVE_API_KEY": "k-123"}
    result = compose_config(path, "eagle3", env=env)
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"]["eagle3"]
    assert [v["source"] for v in service["volumes"]] == ["/srv/models", "/srv/cache"]
    assert service["ports"][0]["published"] == "31000" and service["ports"][0]["target"] == 30000
    assert service["ports"][0]["host_ip"] == "0.0.0.0" and service["environment"]["SERVE_API_KEY"] == "k-123"
    assert service["command"][3:] == ["--model", "/models/Kimi-K2.5", "--draft-model", "/models/Kimi-K2.5-eagle3"]


def test_a_dollar_in_a_profile_value_reaches_the_container_unchanged(tmp_path):
    """Compose interpolates `$`: a value written in the matrix must not be."""
    row = MATRIX.stack("sglang-0.5.9-cu128-local")
    stack = dataclasses.replace(row, serve=dataclasses.replace(row.serve, env={"PROMPT": "$HOME costs $5 ${X}"}))
    files = render.render_stack(stack, MATRIX.project, lambda s: None)
    path = tmp_path / "compose.yaml"
    path.write_text(files[f"images/{stack.name}/compose.yaml"])
    result = compose_config(path, "baseline", env={"HOME": "/root", "X": "x"})
    assert result.returncode == 0, result.stderr
    # `config` writes a literal dollar as $$ again so that its output stays a compose file; had the
    # render not escaped them, $HOME and ${X} would read /root and x here.
    assert json.loads(result.stdout)["services"]["baseline"]["environment"]["PROMPT"] == "$$HOME costs $$5 $${X}"


def test_an_invalid_value_is_refused_by_the_validator(tmp_path):
    """The check has teeth: a GPU count compose cannot read fails `config`."""
    text = (REPO / "images/sglang-0.5.9-cu130/compose.yaml").read_text()
    path = tmp_path / "compose.yaml"
    path.write_text(text.replace("count: all", "count: every", 1))
    result = compose_config(path, "baseline")
    assert result.returncode != 0
    assert "count" in result.stderr


# ---- which image the file names: the moving tag, whatever the lock's outcome --------------------


STACK = MATRIX.stack("sglang-0.5.9-cu128-local")


def test_the_image_is_the_moving_tag_and_a_variable_names_another(tmp_path):
    path = REPO / f"images/{STACK.name}/compose.yaml"
    services = json.loads(compose_config(path, "baseline").stdout)["services"]
    assert services["baseline"]["image"] == "sglang:0.5.9-cu128-local"
    pinned = f"registry.example:5000/team/sglang@{DIGEST}"
    services = json.loads(compose_config(path, "baseline", env={"SGLANG_IMAGE": pinned}).stdout)["services"]
    assert services["baseline"]["image"] == pinned


def test_builds_and_pushes_leave_the_rendered_files_as_they_are(tmp_path):
    """Only the resolution reaches a rendered file: recording an image and a push changes none."""
    lock_path = tmp_path / "matrix.lock"
    lock_stacks([STACK], path=lock_path, resolver=resolution_of, base_resolver=base_digest_of, apt_resolver=system_packages_of)

    def rendered():
        return render.render_stack(STACK, MATRIX.project, lambda s: store.entry(s.name, lock_path).resolution)

    before = rendered()
    base = LockedBase(STACK.base.name, STACK.base.image, True)
    records.record_build(STACK.name, ImageRecord(IMAGE_ID, "sglang:0.5.9-cu128-local-0123456789ab",
                                                 ("sglang:0.5.9-cu128-local-0123456789ab",), "f" * 64, base,
                                                 STACK.source_date_epoch, "r.json", "p.json"),
                         smoke_report(image=IMAGE_ID, stack=STACK.name),
                         lock_path)
    records.record_push(STACK.name, PushRecord("registry.example:5000", "team/sglang", "0.5.9-cu128-local", DIGEST),
                        path=lock_path)
    assert store.entry(STACK.name, lock_path).outcome.push.manifest_digest == DIGEST
    assert rendered() == before


def test_check_covers_the_compose_file(tmp_path):
    files = render.render_all(MATRIX.all_rows(), MATRIX.project)
    copy = tmp_path / "repo"
    render.write(files, copy)
    target = copy / "images/sglang-0.5.9-cu128-local/compose.yaml"
    target.write_text(target.read_text().replace("stop_grace_period: 90s", "stop_grace_period: 10s"))
    (copy / "images/sglang-0.5.9-cu130/compose.yaml").unlink()
    assert render.stale(files, MATRIX.all_rows(), copy) == [
        "images/sglang-0.5.9-cu128-local/compose.yaml (differs)", "images/sglang-0.5.9-cu130/compose.yaml (missing)"]
