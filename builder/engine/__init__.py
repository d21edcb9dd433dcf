"""Container engine backends behind one interface (protocol.Engine): the one door to an engine.

Only this package names a concrete engine. Everything else gets an engine from the CLI, which makes it
here (get_engine, storage_engine), and asks it for what it needs (protocol.Engine's capabilities:
holds, container_api, docker_loader, load_into_docker; StorageEngine's private_storage for verify);
tests/test_engine_door.py keeps it so."""

from __future__ import annotations

import os

from builder.engine.protocol import BuildRequest, BuildResult, Engine, ImageInfo, Layer, StorageEngine
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


def storage_engine() -> StorageEngine:
    """buildah over its default storage and the builder's layout, delivering nowhere: where `builder build`
    leaves its images, where `builder smoke` and `builder push` look when the Docker daemon lacks one,
    and what `builder verify` makes its empty private storages from."""
    from builder.engine.buildah import BuildahEngine

    return BuildahEngine(export_to_docker=False)


__all__ = [
    "BuildRequest", "BuildResult", "DEFAULT_ENGINE", "ENGINE_NAMES", "Engine", "ImageInfo", "Layer", "StorageEngine",
    "default_engine_name", "get_engine", "storage_engine",
]
