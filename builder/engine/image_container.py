"""Where the short containers of the smoke checks and the SBOM's inventory come from.

An image is either in the container API's own storage (`StoredImage`: the Docker daemon's, or
podman's over buildah's), or only in the builder's layout, and then run on a root assembled from its
layers (engine/rootfs_container.py `LayoutImage`). Either way the caller gets a docker-py container
made from one `ContainerRequest`, removed when its block ends, however it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ContextManager, Protocol

import docker
from docker.models.containers import Container
from docker.types import DeviceRequest

from builder.engine.container_limits import own_ulimits


@dataclass(frozen=True)
class ContainerRequest:
    """What a caller runs in an image, and what it adds to the image's own settings."""

    command: tuple[str, ...]
    entrypoint: tuple[str, ...] | None = None  # None: the image's
    environment: Mapping[str, str] = field(default_factory=dict)  # over the image's
    labels: Mapping[str, str] = field(default_factory=dict)  # the owner label, so a dead run's are swept
    device_requests: tuple[DeviceRequest, ...] = ()
    network_disabled: bool = True


class ImageSource(Protocol):
    name: str  # what messages and reports call the image

    def container(self, client: docker.DockerClient, request: ContainerRequest) -> ContextManager[Container]:
        """A created container of the image, not started; removed when the block ends."""


@dataclass(frozen=True)
class StoredImage:
    """An image the container API finds by `name` in its own storage."""

    name: str

    @contextlib.contextmanager
    def container(self, client: docker.DockerClient, request: ContainerRequest) -> Iterator[Container]:
        # This process's limits: podman's defaults exceed some hosts' hard limits (container_limits.py).
        made = client.containers.create(
            self.name, command=list(request.command),
            entrypoint=None if request.entrypoint is None else list(request.entrypoint),
            environment=dict(request.environment), labels=dict(request.labels),
            device_requests=list(request.device_requests), network_disabled=request.network_disabled,
            ulimits=own_ulimits())
        try:
            yield made
        finally:  # a container whose start failed stays behind otherwise
            made.remove(force=True)


def as_source(image: str | ImageSource) -> ImageSource:
    """A name is an image in the container API's own storage (`builder smoke IMAGE`, the docker engine)."""
    return StoredImage(image) if isinstance(image, str) else image
