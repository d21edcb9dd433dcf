"""The local Docker daemon through the `docker` SDK: where finished images go so `docker run` works."""

from __future__ import annotations

from pathlib import Path

import docker
import docker.errors

from builder.engine.protocol import ImageInfo, layers_from_history
from builder.errors import BuildFailure, UserError

START_HINT = "start it with scripts/setup-host (or run `dockerd &` as root)"
# Where the SDK looks when DOCKER_HOST is unset.
DOCKER_DEFAULT_URL = "unix:///var/run/docker.sock"
LOAD_TIMEOUT_S = 3600


class ImageNotFound(UserError):
    pass


def docker_client(timeout: int = 600) -> docker.DockerClient:
    """The one way the builder reaches the local Docker daemon; one line saying how to start it
    when it is not running."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as error:
        raise UserError(f"Docker daemon not running ({_short(error)}): {START_HINT}") from None
    return client


class DockerDaemon:
    def __init__(self) -> None:
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker_client()
        return self._client

    def check(self) -> None:
        self.client  # noqa: B018 - connecting is the check

    def version(self) -> str:
        return str(self.client.version().get("Version", "unknown"))

    def image_id(self, ref: str) -> str | None:
        try:
            return self.client.images.get(ref).id
        except docker.errors.ImageNotFound:
            return None

    def inspect(self, ref: str) -> ImageInfo:
        try:
            attrs = self.client.api.inspect_image(ref)
            history = self.client.api.history(ref)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"image {ref} not found in the Docker daemon") from None
        diff_ids = attrs.get("RootFS", {}).get("Layers", [])
        layers = _pair_layers(diff_ids, list(reversed(history)))
        return ImageInfo(
            image_id=attrs["Id"],
            tags=tuple(sorted(attrs.get("RepoTags") or ())),
            created=attrs.get("Created", ""),
            labels=dict(sorted(((attrs.get("Config") or {}).get("Labels") or {}).items())),
            layers=layers,
            config={
                "architecture": attrs.get("Architecture"), "os": attrs.get("Os"), "created": attrs.get("Created"),
                "config": attrs.get("Config"), "rootfs": attrs.get("RootFS"),
                "history": [{"created_by": h.get("CreatedBy"), "comment": h.get("Comment")}
                            for h in reversed(history)],
            },
        )

    def tag(self, ref: str, new_tag: str) -> None:
        repository, _, tag = new_tag.rpartition(":")
        if not repository or "/" in tag:
            repository, tag = new_tag, "latest"
        try:
            self.client.api.tag(ref, repository, tag)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"image {ref} not found in the Docker daemon") from None

    def remove(self, ref: str) -> None:
        try:
            self.client.api.remove_image(ref, noprune=False)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as error:
            raise BuildFailure(f"docker could not remove {ref}: {_short(error)}") from None

    def load(self, archive: Path) -> str:
        with archive.open("rb") as stream:
            try:
                images = self.client.images.load(stream)
            except docker.errors.APIError as error:
                raise BuildFailure(f"docker load {archive} failed: {_short(error)}") from None
        if len(images) != 1:
            raise BuildFailure(f"{archive}: expected one image, docker loaded {len(images)}")
        return images[0].id

    def load_stream(self, stream) -> str:
        """`docker load` of a docker-archive read from a binary stream; the id it loaded. The daemon
        answers only once it has stored every layer, which for a CUDA image on two cores can take
        longer than other calls are given."""
        try:
            images = docker_client(timeout=LOAD_TIMEOUT_S).images.load(stream)
        except (docker.errors.APIError, docker.errors.ImageLoadError) as error:
            raise BuildFailure(f"docker load failed: {_short(error)}") from None
        if len(images) != 1:
            raise BuildFailure(f"expected one image from docker load, got {len(images)}")
        return images[0].id

    def save(self, ref: str, archive: Path) -> None:
        try:
            chunks = self.client.api.get_image(ref)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"image {ref} not found in the Docker daemon") from None
        partial = archive.with_name(archive.name + ".partial")
        try:
            with partial.open("wb") as stream:
                for chunk in chunks:
                    stream.write(chunk)
            partial.replace(archive)
        finally:
            partial.unlink(missing_ok=True)


def _pair_layers(diff_ids: list[str], history: list[dict]) -> tuple:
    """Match the daemon's history (oldest first) to layers. The daemon drops the config's
    empty_layer flags; a step that made a layer has a size, a metadata-only step (ENV, LABEL) has
    none and, in the classic builder, says "#(nop)". The first rule that accounts for every layer
    wins; with none, the steps stay unknown rather than wrong."""
    for makes_layer in (
        lambda h: h.get("Size", 0) > 0,
        lambda h: "#(nop)" not in h.get("CreatedBy", "") or h.get("Size", 0) > 0,
    ):
        steps = [h for h in history if makes_layer(h)]
        if len(steps) == len(diff_ids):
            return layers_from_history(
                diff_ids,
                [{"created_by": h.get("CreatedBy", "")} for h in steps],
                [h.get("Size") for h in steps],
            )
    return layers_from_history(diff_ids, [], [None] * len(diff_ids))


def _short(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__
