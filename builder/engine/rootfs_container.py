"""A container of an image in the builder's layout, on a root assembled from the image's layers, created
through podman's own API: the image needs no import into podman's storage to be run.

Each layer is indexed once for mounting with its tar blob (oci/layer_index.py); a container gets the
layers stacked by overlayfs under an upper directory of its own (engine/overlay_mount.py), unmounted
and removed with the container. podman's Docker-compatible API makes containers of stored images
only; its libpod API, on the same socket, takes a directory as the root (SpecGenerator's `rootfs`,
podman 4.3). No image then lends the container its settings, so they come from the image's config
here, as the Docker API applies them: its environment under the caller's, its user and working
directory, its entrypoint and command unless the caller names its own. From then on it is an
ordinary container to docker-py (start, logs, inspect, removal).

Archive copies are the exception: podman 4.3 copies into and out of such a root only while the
container is initialized in the runtime; before that, and again once it has exited, it copies into
an empty layer of its own storage instead. So put_archive and get_archive initialize it first (the
runtime's `create`, which a start follows or the removal ends).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests
from docker.models.containers import Container

from builder.engine import overlay_mount, write_once
from builder.engine.container_limits import own_ulimits
from builder.engine.image_container import ContainerRequest
from builder.errors import UserError
from builder.oci.layer_index import LayerIndex, LayerIndexes
from builder.oci.layout import Layout

LIBPOD = "/v4.0.0/libpod"  # podman 4's own API, served beside the compatible one
# podman's compatible API gives every container this and its own API does not: the programs see the
# environment they saw in a container of the stored image.
PODMAN_MARKER = {"container": "podman"}
_NOT_MODIFIED = 304  # init: the container is initialized (or running) already


class RootfsContainer(Container):
    """A docker-py container whose archive copies reach its assembled root (the module's doc says why)."""

    def put_archive(self, path, data):
        self._initialize()
        return super().put_archive(path, data)

    def get_archive(self, path, *args, **kwargs):
        self._initialize()
        return super().get_archive(path, *args, **kwargs)

    def _initialize(self) -> None:
        response = self.client.api.post(_url(self.client, f"/containers/{self.id}/init"))
        if response.status_code != _NOT_MODIFIED:
            _raise_for_status(response)


def create(client: docker.DockerClient, root: Path, config: Mapping, request: ContainerRequest) -> RootfsContainer:
    """A container (created, not started) of the image whose config is `config`, on `root`."""
    response = client.api.post(_url(client, "/containers/create"), data=json.dumps(spec(root, config, request)),
                               headers={"Content-Type": "application/json"})
    _raise_for_status(response)
    made = client.containers.get(response.json()["Id"])
    return RootfsContainer(attrs=made.attrs, client=client, collection=client.containers)


def spec(root: Path, config: Mapping, request: ContainerRequest) -> dict:
    """podman's SpecGenerator: `request` over the image config's runtime settings, as Docker applies them
    (an entrypoint of the caller's drops the image's command too)."""
    settings = config.get("config") or {}
    if request.entrypoint is None:
        entrypoint, command = settings.get("Entrypoint") or [], request.command or settings.get("Cmd") or []
    else:
        entrypoint, command = request.entrypoint, request.command
    body = {
        "rootfs": str(root),
        "entrypoint": list(entrypoint),
        "command": list(command),
        "env": {**PODMAN_MARKER, **_environment(settings.get("Env") or []), **request.environment},
        "labels": dict(request.labels),
        # This process's limits (container_limits.py), named as podman's own API names them.
        "r_limits": [{"type": limit.name, "soft": limit.soft, "hard": limit.hard} for limit in own_ulimits()],
    }
    if settings.get("User"):
        body["user"] = settings["User"]
    if settings.get("WorkingDir"):
        body["work_dir"] = settings["WorkingDir"]
    if request.network_disabled:
        body["netns"] = {"nsmode": "none"}
    return body


def _environment(entries: list[str]) -> dict[str, str]:
    return dict(entry.partition("=")[::2] for entry in entries)


def _url(client: docker.DockerClient, path: str) -> str:
    return f"{client.api.base_url}{LIBPOD}{path}"


def _raise_for_status(response: requests.Response) -> None:
    """podman's refusal as the docker.errors exception docker-py itself would raise."""
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as error:
        docker.errors.create_api_error_from_http_exception(error)


@dataclass(frozen=True)
class LayoutImage:
    """An image of the builder's layout: its config and its layers, base first. Each container stacks
    them under an upper directory of its own in `scratch`."""

    name: str  # the image id
    config: Mapping
    lowers: tuple[LayerIndex, ...]
    scratch: Path

    @contextlib.contextmanager
    def container(self, client: docker.DockerClient, request: ContainerRequest) -> Iterator[RootfsContainer]:
        if request.device_requests:
            raise UserError(f"{self.name} is in the builder's layout only: GPUs are passed to an image in the "
                            "Docker daemon or the engine's storage")
        with overlay_mount.stacked(self.lowers, self.scratch) as overlay:
            made = create(client, overlay.merged, self.config, request)
            try:
                yield made
            finally:  # before the unmount: nothing runs on the root then
                made.remove(force=True)


def layout_image(write_once_root: Path, image_id: str) -> LayoutImage | None:
    """The image as the write-once layout under `write_once_root` holds it, each layer indexed there
    once (kept by diff_id); None when the layout lacks its config or a layer. What killed runs left
    there (their containers' overlays, their half-written indexes) is removed first, unless a live run's
    work is there too (then the next call does it)."""
    layout = Layout(write_once_root / "layout")
    if not layout.has_blob(image_id):
        return None
    config = layout.read_json(image_id)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if not all(layout.has_blob(diff_id) for diff_id in diff_ids):
        return None
    scratch = write_once_root / "containers"
    overlay_mount.sweep(scratch)
    indexes = LayerIndexes(write_once.indexes_dir(write_once_root))
    indexes.sweep()
    return LayoutImage(image_id, config, tuple(indexes.index(layout, diff_id) for diff_id in diff_ids), scratch)
