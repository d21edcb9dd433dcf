"""The small interface every container engine backend implements, and the values it passes around.

"The digest" of an image, everywhere in this project, is its image ID: the sha256 of its config JSON.
The config lists every layer's uncompressed digest (rootfs.diff_ids), the history, labels and created
time, so equal image IDs mean equal images. It is also the one digest that is the same in buildah's
storage, in the Docker daemon and in a registry (where it is the manifest's config digest); a manifest
digest, by contrast, changes with layer compression and manifest format, so it is recorded only where
it is meaningful (after a push, by the registry module).
"""

from __future__ import annotations

import contextlib
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from builder.engine.identity import EngineIdentity
from builder.errors import UserError

if TYPE_CHECKING:
    import docker

    from builder.engine.image_container import ImageSource

# Each line the engine prints during a build; the caller decides how to show it (terminal or CI).
ProgressCallback = Callable[[str], None]

_ADD_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9A-Fa-f.:]+$")
_SECRET_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


def _frozen_mapping(values: Mapping[str, object]) -> Mapping[str, object]:
    """A read-only copy in sorted key order, so argument lists built from it are stable."""
    return types.MappingProxyType({key: values[key] for key in sorted(values)})


@dataclass(frozen=True)
class BuildRequest:
    """Everything an engine needs to build one image; nothing else influences the result."""

    context_dir: Path
    dockerfile: Path
    tags: tuple[str, ...]
    source_date_epoch: int
    build_args: Mapping[str, str] = field(default_factory=dict)
    # "name:ip" pairs added to /etc/hosts of RUN steps only (never stored in a layer).
    add_hosts: tuple[str, ...] = ()
    # secret id -> host file, mounted by `RUN --mount=type=secret,id=ID` at /run/secrets/ID.
    secrets: Mapping[str, Path] = field(default_factory=dict)
    # Network for RUN steps: None (engine default), "host", "none", ...
    network: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    no_cache: bool = False
    target: str | None = None
    # os/arch the image is for, e.g. "linux/amd64": passed to the engine, never left to the host's default.
    platform: str | None = None
    progress: ProgressCallback | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "context_dir", Path(self.context_dir))
        object.__setattr__(self, "dockerfile", Path(self.dockerfile))
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(self, "add_hosts", tuple(self.add_hosts))
        object.__setattr__(self, "build_args", _frozen_mapping(self.build_args))
        object.__setattr__(self, "labels", _frozen_mapping(self.labels))
        object.__setattr__(
            self, "secrets", _frozen_mapping({k: Path(v) for k, v in self.secrets.items()})
        )
        if not self.tags:
            raise UserError("build request has no tag: give at least one image tag")
        if isinstance(self.source_date_epoch, bool) or not isinstance(self.source_date_epoch, int):
            raise UserError(
                f"SOURCE_DATE_EPOCH must be an integer, got {self.source_date_epoch!r}"
            )
        if self.source_date_epoch < 0:
            raise UserError(f"SOURCE_DATE_EPOCH must not be negative, got {self.source_date_epoch}")
        for host in self.add_hosts:
            if not _ADD_HOST.match(host):
                raise UserError(f"bad host entry {host!r}: expected NAME:IP, e.g. index.example:10.0.0.1")
        for secret_id in self.secrets:
            if not _SECRET_ID.match(secret_id):
                raise UserError(f"bad secret id {secret_id!r}: use letters, digits, '.', '_' or '-'")

    def build_arguments(self) -> dict[str, str]:
        """The build arguments every engine's build, and the builder's own, are given: SOURCE_DATE_EPOCH
        from source_date_epoch, then the request's own (a value of its own for it wins)."""
        return {"SOURCE_DATE_EPOCH": str(self.source_date_epoch), **self.build_args}


@dataclass(frozen=True)
class Layer:
    """One filesystem layer: its uncompressed digest, its size in bytes, and the step that made it."""

    diff_id: str
    size: int | None
    created_by: str


@dataclass(frozen=True)
class ImageInfo:
    """What the builder reads back from an engine about a local image."""

    image_id: str  # "sha256:<hex>" of the config: the digest (see the module doc)
    tags: tuple[str, ...]
    created: str
    labels: Mapping[str, str]
    layers: tuple[Layer, ...]
    # The image config as the store shows it (an OCI config in buildah, the daemon's inspect view in
    # Docker): compared field by field when two images should have been one.
    config: Mapping[str, object] = field(default_factory=dict, compare=False)
    # Those bytes exactly, where the store gives them (buildah): their sha256 is the image id, and
    # `--load` hands them to the daemon as they are.
    config_bytes: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    engine: str
    layers: tuple[Layer, ...]
    duration_s: float  # the whole build, delivery included
    # Of which copying the image into the Docker daemon (0 when it was already there or not asked for).
    deliver_s: float = 0.0
    # What delivery wrote into the Docker daemon; 0 where the engine builds inside the daemon.
    delivered_bytes: int = 0
    # The engine and its version that made the image.
    identity: EngineIdentity | None = None
    # The write-once build (engine/write_once.py): layers written, their bytes, layers the cache held.
    written_layers: int = 0
    written_bytes: int = 0
    reused_layers: int = 0


@dataclass(frozen=True)
class ContainerApi:
    """A Docker-compatible API where an engine's images run as they are (nothing copied anywhere)."""

    connect: Callable[[], docker.DockerClient]  # the client once the API answers (a service may still start)
    url: str  # for the watchdog (engine/reaper.py), a process of its own
    service_pid: int | None = None  # a service started for this API, which the watchdog stops too
    # The OCI layout whose refs name the images the builder wrote (buildah's): a run's candidate tag is
    # one of them, which the sweeps (engine/leftovers.py) and the watchdog remove there too.
    layout: Path | None = None

    @property
    def client(self) -> docker.DockerClient:
        return self.connect()


class ImageStore(Protocol):
    """Somewhere images live under names: buildah's storage, the Docker daemon."""

    def image_id(self, ref: str) -> str | None:
        """The id `ref` names here, None when it names nothing."""

    def inspect(self, ref: str) -> ImageInfo:
        """Image id, tags, created time, labels, layers and config."""


class Engine(Protocol):
    """A container engine backend. Refs are tags ("name:tag") or image IDs ("sha256:...").

    A typing interface only: BuildahEngine (engine/buildah.py) and DockerEngine (engine/docker.py)
    implement every method; the bodies here are declarations.
    """

    name: str
    # True when equal inputs give an equal image ID on every clean build (see docs/engines.md).
    reproducible: bool

    def check(self) -> None:
        """Raise UserError (one line, saying how to fix it) when the engine cannot be used."""

    def version(self) -> str:
        """The engine's own version, for provenance (never for anything hashed)."""

    def identity(self) -> EngineIdentity:
        """Name and version: recorded with every image id the engine makes."""

    def stores(self) -> tuple[tuple[str, ImageStore], ...]:
        """(name, store) of every place this engine keeps tags: where an immutable tag must not move."""

    def build(self, request: BuildRequest) -> BuildResult:
        """What `builder build` runs: build, then tag with every request tag, in the engine and in the
        local Docker daemon. Each layer is written once by the builder where the engine allows it
        (buildah: engine/write_once.py), else the engine's own build.

        On failure or Ctrl-C no request tag is left pointing at a new image.
        """

    def inspect(self, ref: str) -> ImageInfo:
        """Image id, tags, created time, labels and layers (with the step that made each)."""

    def image_id(self, ref: str) -> str | None:
        """The image id `ref` names (the sha256 of its config); None when the storage holds no such image."""

    def exists(self, ref: str) -> bool:
        """Whether the engine holds `ref` (buildah: in the layout of the images the builder wrote, or in
        its storage)."""

    def tag(self, ref: str, new_tag: str) -> None:
        """Point `new_tag` at `ref`, in the engine and where it delivers images (the daemon)."""

    def remove(self, ref: str) -> None:
        """Remove the name `ref` (the image itself once no other name holds it)."""

    def load(self, archive: Path) -> str:
        """Load a docker-archive tarball (as `docker save` writes); return the image ID."""

    def save(self, ref: str, archive: Path) -> None:
        """Write the image as a docker-archive tarball with uncompressed layers."""

    # -- what callers ask of an engine instead of asking which engine it is ---------------------

    def holds(self, ref: str) -> bool:
        """Whether the engine can be reached here and its storage holds `ref` (False where it cannot)."""

    def container_api(self) -> contextlib.AbstractContextManager[ContainerApi]:
        """For the block's length, a Docker API over this engine's storage: the smoke checks' containers."""

    def docker_loader(self) -> Engine | None:
        """`--load`, as buildx: this engine over the same storage, also putting what it tags into the
        Docker daemon; None where images are built in the daemon already."""

    def load_into_docker(self, result: BuildResult, tags: Sequence[str]) -> int:
        """The built image into the Docker daemon under `tags`, only the layers it lacks; the bytes moved."""

    def layer_tars(self, ref: str) -> list[tuple[str, Path]] | None:
        """(diff_id, uncompressed tar) of each of the image's layers, base first, where the engine keeps
        them as files of its own (the write-once layout); None where it keeps none or lacks one."""

    def layout_image(self, image_id: str) -> ImageSource | None:
        """The image as a root the builder stacks from its layout's layer trees, for the short containers
        of the smoke checks and the SBOM (engine/rootfs_container.py); None where the engine keeps no
        layout or it lacks the image (then its containers come from the storage, by name)."""


class StorageEngine(Engine, Protocol):
    """An engine whose storage the builder can make anew, mount and read: what `builder verify` needs
    (buildah; the Docker daemon is one shared store)."""

    storage_dir: Path | None  # None: the engine's default storage

    def private_storage(self, storage_dir: Path) -> StorageEngine:
        """This engine over an empty storage of its own under `storage_dir`, delivering nowhere."""

    def build_native(self, request: BuildRequest) -> str:
        """The engine's own image of `request` (its own build of the Dockerfile, untagged)."""

    def canonical_preview(self, native_id: str, request: BuildRequest) -> ImageInfo:
        """The canonical form of the engine's own image `native_id`, computed, not stored: the image
        build() writes of the same Dockerfile, when the Dockerfile is the spec it should be."""

    def mounted(self, ref: str) -> contextlib.AbstractContextManager[Path]:
        """The image's root filesystem, read-only, for the block's length."""

    def ensure_in_storage(self, ref: str) -> None:
        """An image the builder wrote (kept in its OCI layout) into the engine's storage, under the name
        `ref`, only when the storage lacks it: before a container of it runs through container_api()."""

    def reset_storage(self) -> None:
        """Empty a private storage: the next build starts cold."""

    def push_to_registry(self, image_id: str, destination: str, tls_verify: bool, auth_file: Path) -> str:
        """`image_id` from this storage to `destination` (host/repository:tag), with the credentials in
        `auth_file` (containers-auth.json) and no others; the manifest digest the registry stored."""


def check_request_inputs(request: BuildRequest) -> None:
    """Fail with one line before an engine starts on a request whose files are missing."""
    if not request.context_dir.is_dir():
        raise UserError(f"build context {request.context_dir} is not a directory")
    if not request.dockerfile.is_file():
        raise UserError(f"Dockerfile {request.dockerfile} not found")
    for secret_id, path in request.secrets.items():
        if not path.is_file():
            raise UserError(f"secret {secret_id}: file {path} not found")


def layers_from_history(
    diff_ids: list[str], history: list[Mapping[str, object]], sizes: list[int | None]
) -> tuple[Layer, ...]:
    """Pair each layer with the history entry that made it (entries marked empty_layer made none)."""
    steps = [str(h.get("created_by", "")) for h in history if not h.get("empty_layer")]
    if len(steps) != len(diff_ids):
        # History is optional in the image spec; without a match, steps stay unknown.
        steps = [""] * len(diff_ids)
    return tuple(
        Layer(diff_id=d, size=s, created_by=step) for d, s, step in zip(diff_ids, sizes, steps)
    )


def request_flags(request: BuildRequest) -> list[str]:
    """The flags `buildah build` and `docker build` spell alike, in a stable order."""
    argv: list[str] = []
    if request.no_cache:
        argv.append("--no-cache")
    if request.target:
        argv += ["--target", request.target]
    if request.network:
        argv += ["--network", request.network]
    if request.platform:
        argv += ["--platform", request.platform]
    for name, value in request.build_arguments().items():
        argv += ["--build-arg", f"{name}={value}"]
    for name, value in request.labels.items():
        argv += ["--label", f"{name}={value}"]
    for host in request.add_hosts:
        argv += ["--add-host", host]
    for secret_id, path in request.secrets.items():
        argv += ["--secret", f"id={secret_id},src={path}"]
    return argv
