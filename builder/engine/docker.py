"""The Docker engine: builds with BuildKit through the docker CLI, everything else through the SDK.

Why not the SDK's build call: it drives the classic builder, which cannot run the Dockerfiles'
`RUN --mount=type=secret` (the CA bundle) and stamps the wall clock into the config, the history and
every file a RUN step writes. BuildKit is reached as `docker buildx build --load` where the buildx
plugin is installed, else as `DOCKER_BUILDKIT=1 docker build` with a CLI that still has BuildKit
built in (before 23.0; Debian's docker.io 20.10 does). Docker 20.10's BuildKit (v0.8) predates
SOURCE_DATE_EPOCH support (BuildKit 0.11+, rewrite-timestamp 0.13+): its builds are NOT
bit-reproducible, so `reproducible` is False and buildah stays the default engine.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engine.process import run_streaming
from builder.engine.protocol import (BuildRequest, BuildResult, ContainerApi, ImageInfo, check_request_inputs,
                                     request_flags)
from builder.engine.daemon import DOCKER_DEFAULT_URL, DockerDaemon
from builder.engine.identity import EngineIdentity
from builder.errors import UserError

INSTALL_HINT = "install docker-buildx (or Debian's docker.io, whose CLI has BuildKit built in)"
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class BuildKitClient:
    docker: str  # path of the docker CLI
    buildx: bool  # True: `docker buildx build`; False: DOCKER_BUILDKIT=1 `docker build`


def find_buildkit_client(path: str | None = None) -> BuildKitClient | None:
    """The first docker CLI on PATH that can drive BuildKit: with buildx, or one older than 23.0."""
    seen = set()
    for directory in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = Path(directory or ".") / "docker"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        resolved = candidate.resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        if _succeeds([str(candidate), "buildx", "version"]):
            return BuildKitClient(str(candidate), buildx=True)
        version = _output([str(candidate), "version", "--format", "{{.Client.Version}}"])
        if version and _major(version) < 23:
            return BuildKitClient(str(candidate), buildx=False)
    return None


class DockerEngine:
    name = "docker"
    reproducible = False

    def __init__(self, client: BuildKitClient | None = None) -> None:
        self.daemon = DockerDaemon()
        self._client = client

    def check(self) -> None:
        self.daemon.check()

    def version(self) -> str:
        return self.daemon.version()

    def identity(self) -> EngineIdentity:
        return EngineIdentity(self.name, self.version())

    def stores(self) -> tuple[tuple[str, DockerDaemon], ...]:
        return (("docker daemon", self.daemon),)

    def _buildkit(self) -> BuildKitClient:
        if self._client is None:
            self._client = find_buildkit_client()
        if self._client is None:
            raise UserError(f"no docker CLI with BuildKit found: {INSTALL_HINT}, or use --engine buildah")
        return self._client

    def build_command(self, request: BuildRequest, iidfile: Path) -> tuple[list[str], dict]:
        client = self._buildkit()
        env = dict(os.environ)
        if client.buildx:
            argv = [client.docker, "buildx", "build", "--load"]
        else:
            argv = [client.docker, "build"]
            env["DOCKER_BUILDKIT"] = "1"
        argv += [
            "--progress=plain",
            "--file", str(request.dockerfile),
            "--iidfile", str(iidfile),
        ]
        argv += request_flags(request)
        argv.append(str(request.context_dir))
        return argv, env

    def build(self, request: BuildRequest) -> BuildResult:
        self.check()
        check_request_inputs(request)
        self._require_local_bases(request.dockerfile)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="builder-iid-") as scratch:
            iidfile = Path(scratch) / "iid"
            argv, env = self.build_command(request, iidfile)
            run_streaming(argv, f"docker build of {request.tags[0]}", request.progress, env)
            image_id = iidfile.read_text().strip()
        self._apply_tags(image_id, request.tags)
        return BuildResult(
            image_id=image_id,
            tags=request.tags,
            engine=self.name,
            layers=self.inspect(image_id).layers,
            duration_s=round(time.monotonic() - started, 1),
            identity=self.identity(),
        )

    def _require_local_bases(self, dockerfile: Path) -> None:
        """A `localhost/...` base exists only where it was loaded: BuildKit would try a registry on
        localhost:80 for it. `builder base` loads the local base into buildah unless told otherwise."""
        for ref in _FROM.findall(dockerfile.read_text(encoding="utf-8")):
            if ref.startswith("localhost/") and self.daemon.image_id(ref) is None:
                raise UserError(
                    f"base image {ref} is not in the Docker daemon: run `builder base --engine docker`, "
                    f"or copy it from buildah with `buildah push {ref} docker-daemon:{ref}`")

    def _apply_tags(self, image_id: str, tags: tuple[str, ...]) -> None:
        """All tags or none: on failure or Ctrl-C each tag goes back to its previous image."""
        previous = {tag: self.daemon.image_id(tag) for tag in tags}
        try:
            for tag in tags:
                self.daemon.tag(image_id, tag)
        except BaseException:
            for tag, old_id in previous.items():
                if old_id is None:
                    self.daemon.remove(tag)
                else:
                    self.daemon.tag(old_id, tag)
            raise

    def inspect(self, ref: str) -> ImageInfo:
        return self.daemon.inspect(ref)

    def image_id(self, ref: str) -> str | None:
        return self.daemon.image_id(ref)

    def exists(self, ref: str) -> bool:
        return self.daemon.image_id(ref) is not None

    def tag(self, ref: str, new_tag: str) -> None:
        self.daemon.tag(ref, new_tag)

    def remove(self, ref: str) -> None:
        self.daemon.remove(ref)

    def load(self, archive: Path) -> str:
        return self.daemon.load(archive)

    def save(self, ref: str, archive: Path) -> None:
        self.daemon.save(ref, archive)

    # -- capabilities (engine/protocol.py) --------------------------------------------------------

    def holds(self, ref: str) -> bool:
        try:
            return self.exists(ref)
        except UserError:  # the daemon is not running
            return False

    @contextlib.contextmanager
    def container_api(self) -> Iterator[ContainerApi]:
        """The daemon that built the image."""
        yield ContainerApi(lambda: self.daemon.client, os.environ.get("DOCKER_HOST", DOCKER_DEFAULT_URL))

    def docker_loader(self) -> None:
        return None  # built in the daemon: nothing to load

    def layout_image(self, image_id: str) -> None:
        return None  # its images live in the daemon: containers come from there

    def load_into_docker(self, result: BuildResult, tags: Sequence[str]) -> int:
        return 0  # built in the daemon, where build() tagged it

    def layer_tars(self, ref: str) -> list[tuple[str, Path]] | None:
        return None  # the daemon keeps its layers to itself


def _succeeds(argv: list[str]) -> bool:
    return _output(argv) is not None


def _output(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _major(version: str) -> int:
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return 0
