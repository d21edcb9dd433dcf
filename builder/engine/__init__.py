"""Container engine backends behind one interface (protocol.Engine)."""

from __future__ import annotations

import os

from builder.engine.protocol import BuildRequest, BuildResult, Engine, ImageInfo, Layer
from builder.errors import UserError

ENGINE_NAMES = ("buildah", "docker")
DEFAULT_ENGINE = "buildah"


def default_engine_name() -> str:
    """What `--engine` defaults to for every command: $BUILDER_ENGINE, else buildah."""
    return os.environ.get("BUILDER_ENGINE", DEFAULT_ENGINE)


def get_engine(name: str = DEFAULT_ENGINE, export_to_docker: bool = True) -> Engine:
    """The engine called `name`; buildah is the default (reproducible digests, no daemon to build).
    export_to_docker: buildah also copies what it tags into the Docker daemon (`builder build` asks
    for that only with --load)."""
    if name == "buildah":
        from builder.engine.buildah import BuildahEngine

        return BuildahEngine(export_to_docker=export_to_docker)
    if name == "docker":
        from builder.engine.docker import DockerEngine

        return DockerEngine()
    raise UserError(f"unknown engine {name!r}: choose one of {', '.join(ENGINE_NAMES)}")


__all__ = [
    "BuildRequest", "BuildResult", "DEFAULT_ENGINE", "ENGINE_NAMES", "Engine", "ImageInfo", "Layer",
    "default_engine_name", "get_engine",
]
