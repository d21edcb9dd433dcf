"""buildah: the default engine. Daemonless, and `buildah build --timestamp` makes clean rebuilds
bit-identical (same image ID), which the Docker 20.10 daemon's builders cannot.

`builder build` writes its image itself (build(), engine/write_once.py) into the write-once OCI layout,
which stays the image's home: the layout's refs are its tags (engine/written_images.py), and buildah's
storage gets a copy only when something needs one there (ensure_in_storage: a container, a mount, an
archive). The engine's own build (build_native()) runs in buildah's storage, untagged: only the proof
that the Dockerfile is the spec uses it (canonical_preview()). An image can be copied into the local
Docker daemon so `docker run` works: from the layout, only the layers the daemon lacks
(engine/delivery.py); an image only the storage holds (one loaded from an archive), whole
(`buildah push ID docker-daemon:TAG`). Either copy keeps the config blob byte-for-byte, so the image ID
(the sha256 of the config, see engine/protocol.py) is the same everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engine import canonical_preview, delivery, layout_push, podman_service, rootfs_container, write_once
from builder.engine.identity import EngineIdentity
from builder.engine.process import run_quiet, run_streaming
from builder.engine.protocol import (
    BuildRequest,
    BuildResult,
    ContainerApi,
    ImageInfo,
    check_request_inputs,
    layers_from_history,
    request_flags,
)
from builder.engine.daemon import DockerDaemon, ImageNotFound
from builder.engine.written_images import WrittenImages
from builder.errors import BuildFailure, UserError
from builder.oci.layout import Descriptor, Layout
from builder.paths import cache_root

INSTALL_HINT = "install it with scripts/setup-host (or apt-get install buildah)"
# The command that runs buildah, e.g. another release's from a root made by engine_root.py.
COMMAND_ENV = "BUILDER_BUILDAH"


def buildah_command() -> list[str]:
    """$BUILDER_BUILDAH split as a shell would (a command prefix, never run by a shell), else buildah."""
    value = os.environ.get(COMMAND_ENV, "").strip()
    if not value:
        return ["buildah"]
    try:
        return shlex.split(value)
    except ValueError as error:
        raise UserError(f"{COMMAND_ENV}={value!r}: {error}") from None


@dataclass(frozen=True)
class _TagPlaces:
    """Where each of a build's tags points before it moves them: what a failed build puts back."""

    refs: dict[str, Descriptor | None]  # the write-once layout's (written_images.py)
    storage: dict[str, str | None]  # buildah's storage: tag -> image id
    daemon: dict[str, str | None]  # the Docker daemon's, where the engine delivers


class BuildahEngine:
    """buildah with its default storage, or a private one (storage_dir) for builds from an empty cache.

    export_to_docker: copy built images into the Docker daemon (off for throwaway verify builds).
    command: how to run buildah (default: $BUILDER_BUILDAH, else `buildah` from PATH).
    build() writes every layer itself (engine/write_once.py): the layout's image id is the image id.
    The engine's own build (build_native) is kept for the proof that the Dockerfile is the spec: its
    canonical form (canonical_preview) has the same id.
    Names and ids the write-once layout holds are answered from it and act on its refs; all others on
    buildah's storage.
    """

    name = "buildah"
    reproducible = True

    def __init__(self, storage_dir: Path | None = None, export_to_docker: bool = True,
                 command: list[str] | None = None) -> None:
        self.storage_dir = storage_dir
        self.export_to_docker = export_to_docker
        self.command = list(command) if command else buildah_command()
        self.daemon = DockerDaemon()
        self._version: str | None = None

    # -- command lines -------------------------------------------------------------------------

    def _global_args(self) -> list[str]:
        if self.storage_dir is None:
            return list(self.command)
        return [
            *self.command,
            "--root", str(self.storage_dir / "root"),
            "--runroot", str(self.storage_dir / "run"),
            "--storage-driver", "overlay",
        ]

    def build_command(self, request: BuildRequest, iidfile: Path) -> list[str]:
        argv = self._global_args() + [
            "build",
            "--file", str(request.dockerfile),
            "--iidfile", str(iidfile),
            # Same inputs -> same image ID: fixed created times for the config, history and files.
            "--timestamp", str(request.source_date_epoch),
            # The buildah version label would tie the digest to the tool's version.
            "--identity-label=false",
            "--format", "oci",
            "--layers",
            # Base images are local (no registry here): never try to pull one.
            "--pull=never",
            "--force-rm",
        ]
        argv += request_flags(request)
        argv.append(str(request.context_dir))
        return argv

    # -- Engine interface ----------------------------------------------------------------------

    def check(self) -> None:
        if shutil.which(self.command[0]) is None:
            where = f" ({COMMAND_ENV}={shlex.join(self.command)})" if self.command != ["buildah"] else ""
            raise UserError(f"{self.command[0]} not found{where}: {INSTALL_HINT}")
        if self.export_to_docker:
            self.daemon.check()

    def version(self) -> str:
        if self._version is None:
            output = run_quiet([*self.command, "--version"], "buildah --version").split()
            self._version = output[2] if len(output) > 2 else " ".join(output)
        return self._version

    def identity(self) -> EngineIdentity:
        return EngineIdentity(self.name, self.version())

    def stores(self) -> tuple[tuple[str, object], ...]:
        own = (("buildah", self),)
        return own + ((("docker daemon", self.daemon),) if self.export_to_docker else ())

    def build_native(self, request: BuildRequest) -> str:
        """The engine's own image of `request` (`buildah build`), untagged, in its storage."""
        self.check()
        check_request_inputs(request)
        self._bases_into_storage(request)
        self._check_single_names(request)
        with tempfile.TemporaryDirectory(prefix="builder-iid-") as scratch:
            iidfile = Path(scratch) / "iid"
            run_streaming(
                self.build_command(request, iidfile),
                what=f"buildah build of {request.tags[0]}",
                on_line=request.progress,
            )
            return _normalise_id(iidfile.read_text().strip())

    def build(self, request: BuildRequest) -> BuildResult:
        """The builder's own build of the rendered Dockerfile (engine/write_once.py): buildah runs the
        steps that need the image's programs, the builder writes every layer once into a content-keyed
        OCI layout, where the finished image stays: the request's tags become the layout's refs, and
        buildah's storage gets no copy of it. Steps the layer cache holds are not run; on failure or
        Ctrl-C no request tag moves."""
        started = time.monotonic()
        self.check()
        check_request_inputs(request)
        _check_writable(request)
        self._bases_into_storage(request)  # an import holds the store as the build does (write_once.in_use)
        previous = self._previous_tags(request.tags)
        root = self._write_once_root()
        try:
            with write_once.in_use(root, sweep=True) as swept:
                if swept and request.progress:
                    request.progress(f"removed what a killed build left: {', '.join(swept)}")
                written = write_once.build_into_layout(self._global_args(), request, root)
        except BaseException:
            self._restore_tags(previous)
            raise
        info = self.inspect(written.image_id)
        tagging = time.monotonic()
        delivered = self._apply_tags(info, request.tags, previous)
        return BuildResult(
            image_id=written.image_id,
            tags=request.tags,
            engine=self.name,
            layers=info.layers,
            duration_s=round(time.monotonic() - started, 1),
            deliver_s=round(time.monotonic() - tagging, 1),
            delivered_bytes=delivered,
            identity=self.identity(),
            written_layers=written.layers_written,
            written_bytes=written.bytes_written,
            reused_layers=written.layers_reused,
        )

    def _write_once_root(self) -> Path:
        """The write-once build's layout, layer cache and scratch: with the storage they feed."""
        if self.storage_dir is not None:
            return self.storage_dir / "write-once"
        return cache_root() / "write-once"

    def _layout_root(self) -> Path:
        """The write-once layout: the written images' home, its refs their tags."""
        return self._write_once_root() / "layout"

    def _written(self) -> WrittenImages:
        return WrittenImages(Layout(self._layout_root()))

    def ensure_in_storage(self, ref: str) -> None:
        """An image the builder wrote, into buildah's storage for what needs it there (a container, a
        mount, an archive): imported from the layout only when the storage lacks it, and named `ref`
        there (for an image id, a name the layout gives it). The storage's own images are left as they are."""
        written = self._written()
        image_id = written.resolve(ref)
        if image_id is None:
            return
        name = written.storage_name(ref, image_id)
        if self._stored(image_id):
            if self._storage_image_id(name) != image_id:
                run_quiet(self._global_args() + ["tag", image_id, name], f"buildah tag {image_id} {name}")
            return
        config, layers = written.image(image_id)
        root = self._write_once_root()
        # Holding the store: a build that finds itself alone sweeps the scratch, where the import's view lies.
        with write_once.in_use(root):
            write_once.import_image(self._global_args(), written.layout, config, layers, write_once.scratch_dir(root),
                                    name)

    def _bases_into_storage(self, request: BuildRequest) -> None:
        """A base the builder wrote, imported: the engine builds FROM its storage."""
        for ref in base_image_refs(request.dockerfile.read_text(errors="replace"), request.build_args):
            self.ensure_in_storage(ref)

    # -- the engine's own build, in canonical form (the spec's proof) ------------------------------

    def canonical_preview(self, native_id: str, request: BuildRequest) -> ImageInfo:
        """The canonical form of the engine's image `native_id` of `request` (id, layers, config),
        computed, not stored (engine/canonical_preview.py): the id build() gives the same Dockerfile."""
        config = canonical_preview.canonical_config(self._global_args(), self._native(native_id, request),
                                                    self._scratch_dir())
        data = json.loads(config)
        diff_ids = list(data.get("rootfs", {}).get("diff_ids", []))
        layers = layers_from_history(diff_ids, list(data.get("history") or []), [None] * len(diff_ids))
        labels = dict((data.get("config") or {}).get("Labels") or {})
        return ImageInfo("sha256:" + hashlib.sha256(config).hexdigest(), (), str(data.get("created", "")), labels,
                         layers, data)

    def _native(self, native_id: str, request: BuildRequest) -> canonical_preview.NativeImage:
        info = self.inspect(native_id)
        base_layers, base_history = self._base_prefix(info, request)
        return canonical_preview.NativeImage(
            image_id=native_id, config=dict(info.config),
            diff_ids=tuple(layer.diff_id for layer in info.layers),
            steps=tuple(layer.created_by for layer in info.layers),
            base_layers=base_layers, base_history=base_history,
        )

    def _scratch_dir(self) -> Path:
        return self.storage_dir / "tmp" if self.storage_dir is not None else Path(tempfile.gettempdir())

    def _base_prefix(self, info: ImageInfo, request: BuildRequest) -> tuple[int, int]:
        """(layers, history entries) the image takes unchanged from its base: the base named in the
        Dockerfile whose layers are the longest prefix of the image's."""
        diff_ids = [layer.diff_id for layer in info.layers]
        best = (0, 0)
        for ref in base_image_refs(request.dockerfile.read_text(errors="replace"), request.build_args):
            if not self._stored(ref):
                continue
            base = self._inspect_stored(ref)
            own = [layer.diff_id for layer in base.layers]
            if diff_ids[:len(own)] == own and len(own) > best[0]:
                best = (len(own), len(base.config.get("history") or []))
        return best

    def _check_single_names(self, request: BuildRequest) -> None:
        """buildah records "FROM <name>" in the history, and with a base image known by several
        names it may record another name than the Dockerfile's (seen with 1.28): the digest would
        then depend on which names the storage happens to hold. Refuse that case up front."""
        text = request.dockerfile.read_text(errors="replace")
        for ref in base_image_refs(text, request.build_args):
            if not self._stored(ref):
                continue  # buildah reports a missing base itself
            names = self._storage_names(ref)
            if len(names) > 1:
                others = ", ".join(name for name in names if name != ref) or ", ".join(names)
                raise UserError(
                    f"base image {ref} also has the names {others}: the digest would depend on "
                    f"which name buildah records; remove the extra names (buildah rmi NAME)"
                )

    def _previous_tags(self, tags: tuple[str, ...]) -> _TagPlaces:
        """Where each tag points now, in the layout, buildah's storage and the daemon."""
        return _TagPlaces(
            refs=self._written().snapshot(tags),
            storage={tag: self._storage_image_id(tag) for tag in tags},
            daemon={tag: self.daemon.image_id(tag) for tag in tags} if self.export_to_docker else {},
        )

    def _apply_tags(self, info: ImageInfo, tags: tuple[str, ...], previous_tags: _TagPlaces | None = None) -> int:
        """Tag where the image lives (the layout's refs, all in one index write, or buildah's storage) and
        copy into the daemon; on any failure or Ctrl-C, put every tag back where it was (as
        `previous_tags` found them, else as they are now), so no tag points at an image that was not
        fully delivered. Returns the bytes written into the daemon."""
        image_id = info.image_id
        delivered = 0
        previous = previous_tags or self._previous_tags(tags)
        written = self._written()
        in_layout = written.holds(image_id)
        try:
            if in_layout:
                written.name(tags, image_id)
            else:
                run_quiet(self._global_args() + ["tag", image_id, *tags], "buildah tag")
                written.unname(tags)  # the storage answers for them now
            if self.export_to_docker:
                if self.daemon.image_id(image_id) == image_id:
                    # Delivered by an earlier build of the same inputs: copying gigabytes again adds nothing.
                    self.daemon.tag(image_id, tags[0])
                else:
                    delivered = self._deliver(info, tags[0])
                for tag in tags[1:]:
                    self.daemon.tag(image_id, tag)
        except BaseException:
            self._restore_tags(previous)
            raise
        if in_layout:
            self._drop_stale_storage_names(previous.storage, image_id)
        return delivered

    def _drop_stale_storage_names(self, stored: Mapping[str, str | None], image_id: str) -> None:
        """The layout's refs took these names (`stored`: the image each named in buildah's storage): where
        the storage gives one to another image, it goes there too, or buildah would still find that image
        by it (and record it as a base's name). Only an image of the storage's own keeps its last name,
        the layout's ref answering for it before the storage."""
        written = self._written()
        for name, stored_id in stored.items():
            if stored_id not in (None, image_id) and (len(self._storage_names(stored_id)) > 1
                                                      or written.holds(stored_id)):
                run_quiet(self._global_args() + ["rmi", name], f"removing the name {name} from buildah's storage")

    def _restore_tags(self, previous: _TagPlaces) -> None:
        self._written().restore(previous.refs)
        for tag, old_id in previous.storage.items():
            if self._storage_image_id(tag) == old_id:
                continue
            if old_id is None:
                self._untag(tag)
            else:
                run_quiet(self._global_args() + ["tag", old_id, tag], "buildah tag")
        for tag, old_id in previous.daemon.items():
            if old_id is None:
                self.daemon.remove(tag)
            else:
                self.daemon.tag(old_id, tag)

    def _deliver(self, info: ImageInfo, tag: str) -> int:
        """Only the layers the daemon lacks when it holds some, read from the write-once layout where it
        holds the image; else the whole image through a `buildah push`. Returns the bytes moved."""
        diff_ids = [layer.diff_id for layer in info.layers]
        skip = delivery.layers_to_skip(diff_ids, delivery.held_chains(self.daemon.client))
        moved = self._deliver_from_layout(info, diff_ids, skip, tag)
        if moved is None:
            moved = self._deliver_through_push(info, tag)
        self._check_delivered(info.image_id, tag)
        return moved

    def _deliver_from_layout(self, info: ImageInfo, diff_ids: list[str], skip: set[str], tag: str) -> int | None:
        """None when the write-once layout lacks a layer the daemon needs (or the store shows the config
        otherwise than as its id's bytes). A failed partial copy (a layer the daemon held went meanwhile)
        is followed by the whole image; a failed whole copy is the daemon's own one-line error."""
        config = info.config_bytes
        if "sha256:" + hashlib.sha256(config).hexdigest() != info.image_id:
            return None
        blobs = self._layout_root() / "blobs" / "sha256"
        load = self.daemon.load_stream
        try:
            done = delivery.deliver_from_layout(blobs, config, diff_ids, skip, tag, load)
        except (BuildFailure, OSError):
            if not skip:
                raise
            done = delivery.deliver_from_layout(blobs, config, diff_ids, set(), tag, load)
        return None if done is None else done.bytes_moved

    def _deliver_through_push(self, info: ImageInfo, tag: str) -> int:
        """An image only the storage holds: whole, straight into the daemon."""
        run_quiet(
            self._global_args() + ["push", "--quiet", info.image_id, f"docker-daemon:{tag}"],
            f"copying {tag} into the Docker daemon",
        )
        return sum(layer.size or 0 for layer in info.layers)

    def _check_delivered(self, image_id: str, tag: str) -> None:
        copied = self.daemon.image_id(tag)
        if copied is None:
            raise BuildFailure(f"the Docker daemon holds no {tag} after the copy, which reported no error: "
                               "dockerd's log says why")
        if copied != image_id:
            raise BuildFailure(
                f"the Docker daemon holds {tag} as {copied}, buildah built {image_id}: "
                "the copy changed the image config"
            )

    def _untag(self, tag: str) -> None:
        # `buildah rmi NAME` on an image with other names removes only that name.
        if self._stored(tag):
            run_quiet(self._global_args() + ["rmi", tag], f"removing tag {tag}")

    def exists(self, ref: str) -> bool:
        return self._written().resolve(ref) is not None or self._stored(ref)

    def image_id(self, ref: str) -> str | None:
        return self._written().resolve(ref) or self._storage_image_id(ref)

    def inspect(self, ref: str) -> ImageInfo:
        written = self._written()
        image_id = written.resolve(ref)
        if image_id is not None:
            return written.info(image_id)
        return self._inspect_stored(ref)

    # -- buildah's storage alone -----------------------------------------------------------------

    def _stored(self, ref: str) -> bool:
        return _exit_ok(self._global_args() + ["inspect", "--type", "image", ref])

    def _storage_image_id(self, ref: str) -> str | None:
        return self._inspect_stored(ref).image_id if self._stored(ref) else None

    def _inspect_stored(self, ref: str) -> ImageInfo:
        if shutil.which(self.command[0]) is None:
            raise UserError(f"{self.command[0]} not found: {INSTALL_HINT}")
        if not self._stored(ref):
            raise ImageNotFound(f"image {ref} not found in buildah's storage")
        raw = json.loads(
            run_quiet(self._global_args() + ["inspect", "--type", "image", ref], f"inspect {ref}")
        )
        config = json.loads(raw["Config"])
        manifest = json.loads(raw["Manifest"])
        diff_ids = config.get("rootfs", {}).get("diff_ids", [])
        sizes = [layer.get("size") for layer in manifest.get("layers", [])]
        if len(sizes) != len(diff_ids):
            sizes = [None] * len(diff_ids)
        return ImageInfo(
            image_id=_normalise_id(raw["FromImageID"]),
            tags=self._storage_names(ref),
            created=config.get("created", ""),
            labels=dict(sorted((config.get("config", {}).get("Labels") or {}).items())),
            layers=layers_from_history(diff_ids, config.get("history", []), sizes),
            config=config,
            config_bytes=raw["Config"].encode(),
        )

    def _storage_names(self, ref: str) -> tuple[str, ...]:
        listing = json.loads(
            run_quiet(self._global_args() + ["images", "--json", ref], f"buildah images {ref}")
        )
        return tuple(sorted(name for image in listing for name in image.get("names") or ()))

    # -- names -----------------------------------------------------------------------------------

    def tag(self, ref: str, new_tag: str) -> None:
        """In the layout's refs for an image it holds (where buildah's storage gives the name to another
        image, it leaves the storage: _drop_stale_storage_names), else in buildah's storage (the name then
        leaves the refs): one home answers for it. Then in the daemon, where the engine delivers."""
        written = self._written()
        image_id = written.resolve(ref)
        if image_id is not None:
            stored = {new_tag: self._storage_image_id(new_tag)}
            written.name([new_tag], image_id)
            self._drop_stale_storage_names(stored, image_id)
        else:
            run_quiet(self._global_args() + ["tag", ref, new_tag], f"buildah tag {ref} {new_tag}")
            written.unname([new_tag])
        if self.export_to_docker:
            info = self.inspect(ref)
            image_id = info.image_id
            if self.daemon.image_id(image_id) is None:
                self._deliver(info, new_tag)
            else:
                self.daemon.tag(image_id, new_tag)

    def remove(self, ref: str) -> None:
        """The name from the layout's refs, buildah's storage (with the image there once no other name
        holds it) and the daemon; the layout's blobs stay, its content cache."""
        self._written().remove(ref)
        if self._stored(ref):
            run_quiet(self._global_args() + ["rmi", ref], f"buildah rmi {ref}")
        if self.export_to_docker:
            self.daemon.remove(ref)

    def load(self, archive: Path) -> str:
        self.check()
        output = run_quiet(
            self._global_args() + ["pull", "--quiet", f"docker-archive:{archive}"],
            f"loading {archive} into buildah",
        )
        return _normalise_id(output.strip().splitlines()[-1])

    def save(self, ref: str, archive: Path) -> None:
        self.ensure_in_storage(ref)
        partial = archive.with_name(archive.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            run_quiet(
                self._global_args() + ["push", "--quiet", ref, f"docker-archive:{partial}"],
                f"saving {ref}",
            )
            partial.replace(archive)
        finally:
            partial.unlink(missing_ok=True)

    # -- capabilities (engine/protocol.py) --------------------------------------------------------

    def push_to_registry(self, image_id: str, destination: str, tls_verify: bool, auth_file: Path) -> str:
        """From the write-once layout when it holds the image (engine/layout_push.py), else from the storage."""
        root, layout = self._write_once_root(), Layout(self._layout_root())
        if layout.root.is_dir():
            # Holding the store: a build that finds itself alone sweeps the scratch, where the push's view lies.
            with write_once.in_use(root):
                held = layout_push.held_image(layout, image_id)
                if held is not None:
                    return layout_push.push(layout, write_once.scratch_dir(root), held, destination, tls_verify,
                                            auth_file)
        with tempfile.TemporaryDirectory(prefix="builder-push-") as scratch:
            digest_file = Path(scratch) / "digest"
            run_quiet(self._global_args() + [
                "push", "--quiet", "--digestfile", str(digest_file), f"--tls-verify={str(tls_verify).lower()}",
                "--authfile", str(auth_file), image_id, f"docker://{destination}"], f"buildah push {destination}")
            digest = digest_file.read_text().strip() if digest_file.is_file() else ""
        if not digest.startswith("sha256:"):
            raise BuildFailure(f"push {destination}: buildah reported no digest")
        return digest

    def holds(self, ref: str) -> bool:
        return shutil.which(self.command[0]) is not None and self.exists(ref)

    @contextlib.contextmanager
    def container_api(self) -> Iterator[ContainerApi]:
        """podman's Docker API over this storage (engine/podman_service.py): no copy into the daemon. An image
        the builder wrote runs there once ensure_in_storage put it there."""
        with podman_service.serve(self.storage_dir) as service:
            yield ContainerApi(service.client, service.url, service.pid, self._layout_root())

    def layer_tars(self, ref: str) -> list[tuple[str, Path]] | None:
        """From the write-once layout, whose layer blobs are uncompressed (blob digest = diff_id)."""
        layout = Layout(self._layout_root())
        layers = [(layer.diff_id, layout.blob_path(layer.diff_id)) for layer in self.inspect(ref).layers]
        return layers if all(path.is_file() for _, path in layers) else None

    def layout_image(self, image_id: str) -> rootfs_container.LayoutImage | None:
        return rootfs_container.layout_image(self._write_once_root(), image_id)

    def docker_loader(self) -> BuildahEngine:
        return BuildahEngine(storage_dir=self.storage_dir, export_to_docker=True, command=self.command)

    def load_into_docker(self, result: BuildResult, tags: Sequence[str]) -> int:
        """Tagging delivers (only the layers the daemon lacks); the bytes are counted first, while the
        daemon still lacks them."""
        if not self.export_to_docker:
            raise UserError("this buildah engine delivers nowhere: load through its docker_loader()")
        missing = 0
        if self.daemon.image_id(result.image_id) is None:
            skip = delivery.layers_to_skip([l.diff_id for l in result.layers], delivery.held_chains(self.daemon.client))
            missing = sum(layer.size or 0 for layer in result.layers if layer.diff_id not in skip)
        for name in tags:
            self.tag(name, name)
        return missing

    def private_storage(self, storage_dir: Path) -> BuildahEngine:
        return BuildahEngine(storage_dir=storage_dir, export_to_docker=False, command=self.command)

    @contextlib.contextmanager
    def mounted(self, ref: str) -> Iterator[Path]:
        """The image's root filesystem, mounted read-only through a throwaway working container."""
        self.ensure_in_storage(ref)
        container = run_quiet(self._global_args() + ["from", "--pull=never", "--quiet", ref],
                              f"buildah from {ref}").strip().splitlines()[-1]
        try:
            yield Path(run_quiet(self._global_args() + ["mount", container], f"buildah mount {ref}").strip())
        finally:
            run_quiet(self._global_args() + ["umount", container], f"buildah umount {container}")
            run_quiet(self._global_args() + ["rm", container], f"buildah rm {container}")

    def reset_storage(self) -> None:
        """Empty a private storage (containers, images and the layout's names of them, cache): the next
        build starts cold."""
        if self.storage_dir is None:
            raise UserError("refusing to empty buildah's shared storage: use a private storage_dir")
        run_quiet(self._global_args() + ["rm", "--all"], "buildah rm --all")
        run_quiet(self._global_args() + ["rmi", "--all", "--force"], "buildah rmi --all")
        layout = Layout(self._layout_root())
        layout.remove_refs(layout.ref_names())


_FROM = re.compile(r"^[ \t]*FROM[ \t]+(?:--\S+[ \t]+)*(\S+)(?:[ \t]+AS[ \t]+(\S+))?", re.I | re.M)
_GLOBAL_ARG = re.compile(r"^[ \t]*ARG[ \t]+(\w+)=(\S+)", re.I | re.M)
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def base_image_refs(dockerfile: str, build_args: Mapping[str, str]) -> list[str]:
    """The images a Dockerfile builds FROM (not scratch, not its own stages), with ARG values
    substituted; a reference whose variables are unknown is left out."""
    first_from = _FROM.search(dockerfile)
    preamble = dockerfile[: first_from.start()] if first_from else dockerfile
    values = {name: value.strip("\"'") for name, value in _GLOBAL_ARG.findall(preamble)}
    values.update(build_args)
    stages, refs = set(), []
    for match in _FROM.finditer(dockerfile):
        unknown = [n for pair in _VARIABLE.findall(match[1]) for n in pair if n and n not in values]
        ref = _VARIABLE.sub(lambda m: values.get(m[1] or m[2], ""), match[1])
        if not unknown and ref.lower() != "scratch" and ref not in stages and ref not in refs:
            refs.append(ref)
        if match[2]:
            stages.add(match[2])
    return refs


def _check_writable(request: BuildRequest) -> None:
    """What the write-once build takes: the builder's own requests (no network, no labels, hosts or
    secrets given from outside the Dockerfile, one stage)."""
    unsupported = [name for name, value in (("labels", request.labels), ("add_hosts", request.add_hosts),
                                            ("secrets", request.secrets), ("target", request.target)) if value]
    if request.network not in (None, "none"):
        unsupported.append(f"network {request.network}")
    if unsupported:
        raise UserError(f"the write-once build runs every step with no network and takes no "
                        f"{', '.join(unsupported)}")


def _normalise_id(image_id: str) -> str:
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def _exit_ok(argv: list[str]) -> bool:
    return (
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    )
