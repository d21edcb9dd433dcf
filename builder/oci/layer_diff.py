"""Compare two builds of one image and say where they differ: the first differing layer (with the
Dockerfile step that made it) and the files that differ in it, by comparing the layer tars.

Images are read from docker-archive tarballs (`docker save`, `buildah push docker-archive:`) or OCI
image layouts (`buildah push oci:DIR`), so either engine's output can be compared.
`build_twice` makes the two builds with buildah, each in its own empty storage (a cold cache that
no other build on the host can warm or disturb).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure, UserError
from builder.files import sha256_file
from builder.oci.layout import Layout, LayoutError

_CHUNK = 1 << 20
_MAX_FILES_LISTED = 50


@dataclass(frozen=True)
class LayerRef:
    diff_id: str
    step: str
    member: str  # docker-archive member name or OCI blob path


@dataclass(frozen=True)
class ImageArchive:
    path: Path
    config: dict
    config_digest: str
    layers: tuple[LayerRef, ...]


@dataclass(frozen=True)
class FileDifference:
    path: str
    what: str  # "only in first", "only in second", "content", "mode", "mtime", ...


@dataclass(frozen=True)
class Comparison:
    first_id: str
    second_id: str
    layer_index: int | None = None  # 0-based index of the first differing layer
    step: str = ""
    files: tuple[FileDifference, ...] = ()
    config_fields: tuple[str, ...] = ()  # config paths that differ (when no layer does)
    # The engine (name and version) that made each image, where known: named when the ids differ.
    first_engine: str = ""
    second_engine: str = ""

    @property
    def identical(self) -> bool:
        return self.first_id == self.second_id

    def describe(self) -> list[str]:
        if self.identical:
            return [f"identical: {self.first_id}"]
        lines = [f"digests differ: {self.first_id} != {self.second_id}"]
        if self.layer_index is not None:
            lines.append(f"first differing layer: #{self.layer_index + 1} made by: {self.step or '?'}")
            for difference in self.files[:_MAX_FILES_LISTED]:
                lines.append(f"  {difference.path}: {difference.what}")
            if len(self.files) > _MAX_FILES_LISTED:
                lines.append(f"  ... and {len(self.files) - _MAX_FILES_LISTED} more files")
        if self.config_fields:
            lead = "all layers equal; image config differs in" if self.layer_index is None else \
                "the image config differs too, in"
            lines.append(f"{lead}: {', '.join(self.config_fields)}")
        if self.first_engine or self.second_engine:
            lines.append(f"engines: {self.first_engine or 'unrecorded'} made {self.first_id}, "
                         f"{self.second_engine or 'unrecorded'} made {self.second_id}")
        return lines


# -- reading images ------------------------------------------------------------------------------


def read_image(path: Path) -> ImageArchive:
    """Read a docker-archive tarball or an OCI image layout directory (one image)."""
    path = Path(path)
    if path.is_dir():
        return _read_oci_layout(path)
    if not path.is_file():
        raise UserError(f"{path}: no such image archive or OCI layout")
    with tarfile.open(path) as archive:
        names = set(archive.getnames())
        if "manifest.json" in names:
            manifest = json.loads(_read_member(archive, "manifest.json"))
            if len(manifest) != 1:
                raise UserError(f"{path}: holds {len(manifest)} images; compare one at a time")
            config_bytes = _read_member(archive, manifest[0]["Config"])
            return _image(path, config_bytes, manifest[0]["Layers"])
    raise UserError(f"{path}: not a docker-archive (no manifest.json)")


def _read_oci_layout(path: Path) -> ImageArchive:
    """The layout's one image; its manifest and config are checked against their digests (layers are
    read, and so hashed, when they are compared)."""
    layout = Layout(path)
    try:
        manifests = layout.index().get("manifests", [])
        if len(manifests) != 1:
            raise UserError(f"{path}: holds {len(manifests)} images; compare one at a time")
        manifest = layout.manifest()
        config_bytes = layout.read_blob(manifest["config"]["digest"])
        members = [str(layout.blob_path(layer["digest"]).relative_to(path)) for layer in manifest["layers"]]
    except LayoutError as error:
        raise UserError(str(error)) from None
    return _image(path, config_bytes, members)


def _image(path: Path, config_bytes: bytes, members: list[str]) -> ImageArchive:
    config = json.loads(config_bytes)
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    if len(diff_ids) != len(members):
        raise UserError(f"{path}: config lists {len(diff_ids)} layers, manifest {len(members)}")
    steps = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    if len(steps) != len(diff_ids):
        steps = [""] * len(diff_ids)
    return ImageArchive(
        path=path,
        config=config,
        config_digest="sha256:" + hashlib.sha256(config_bytes).hexdigest(),
        layers=tuple(LayerRef(d, s, m) for d, s, m in zip(diff_ids, steps, members)),
    )


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    stream = archive.extractfile(name)
    if stream is None:
        raise UserError(f"{archive.name}: {name} is not a file")
    return stream.read()


@contextmanager
def _open_layer(image: ImageArchive, layer: LayerRef) -> Iterator[IO[bytes]]:
    if image.path.is_dir():
        with (image.path / layer.member).open("rb") as stream:
            yield stream
    else:
        with tarfile.open(image.path) as archive:
            stream = archive.extractfile(layer.member)
            if stream is None:
                raise UserError(f"{image.path}: layer {layer.member} missing")
            yield stream


# -- comparing -----------------------------------------------------------------------------------


def layer_entries(image: ImageArchive, layer: LayerRef) -> dict[str, tuple]:
    """path -> (type, mode, uid, gid, mtime, size, content sha256, link target) for every entry."""
    entries: dict[str, tuple] = {}
    with _open_layer(image, layer) as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
        for member in tar:
            content = ""
            if member.isfile():
                digest = hashlib.sha256()
                stream = tar.extractfile(member)
                assert stream is not None
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                content = digest.hexdigest()
            name = member.name.removeprefix("./").rstrip("/") or "."
            entries[name] = (
                member.type, member.mode, member.uid, member.gid, int(member.mtime),
                member.size, content, member.linkname,
            )
    return entries


def tree_entries(root: Path) -> dict[str, tuple]:
    """The same view as layer_entries, of a mounted root filesystem (every file, not one layer's)."""
    entries: dict[str, tuple] = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = Path(directory) / name
            info = path.lstat()
            content, link, kind = "", "", tarfile.DIRTYPE
            if stat.S_ISREG(info.st_mode):
                kind, content = tarfile.REGTYPE, sha256_file(path)
            elif stat.S_ISLNK(info.st_mode):
                kind, link = tarfile.SYMTYPE, os.readlink(path)
            elif not stat.S_ISDIR(info.st_mode):
                kind = tarfile.CHRTYPE if stat.S_ISCHR(info.st_mode) else tarfile.FIFOTYPE
            size = info.st_size if kind == tarfile.REGTYPE else 0
            entries[path.relative_to(root).as_posix()] = (
                kind, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, int(info.st_mtime), size, content, link)
    return entries


_FIELDS = ("type", "mode", "uid", "gid", "mtime", "size", "content", "link target")


def diff_entries(first: dict[str, tuple], second: dict[str, tuple]) -> tuple[FileDifference, ...]:
    differences = []
    for path in sorted(first.keys() | second.keys()):
        if path not in second:
            differences.append(FileDifference(path, "only in first"))
        elif path not in first:
            differences.append(FileDifference(path, "only in second"))
        elif first[path] != second[path]:
            changed = [n for n, a, b in zip(_FIELDS, first[path], second[path]) if a != b]
            # A changed content changes the size too; name the cause, not both.
            if "content" in changed and "size" in changed:
                changed.remove("size")
            differences.append(FileDifference(path, ", ".join(changed)))
    return tuple(differences)


def compare(first_path: Path, second_path: Path) -> Comparison:
    first, second = read_image(first_path), read_image(second_path)
    result = Comparison(first_id=first.config_digest, second_id=second.config_digest)
    if result.identical:
        return result
    index, step = first_differing_layer(first.layers, second.layers)
    if index is None:
        return replace(result, config_fields=config_differences(first.config, second.config))
    a = first.layers[index] if index < len(first.layers) else None
    b = second.layers[index] if index < len(second.layers) else None
    if a is None or b is None:
        only = "first" if b is None else "second"
        return replace(result, layer_index=index, step=step, files=(FileDifference("(whole layer)", f"only in {only}"),))
    files = diff_entries(layer_entries(first, a), layer_entries(second, b))
    if not files:
        # Same entries, different bytes: the tar framing itself differs (order, headers).
        files = (FileDifference("(tar stream)", "same files, different archive bytes"),)
    return replace(result, layer_index=index, step=step, files=files)


def first_differing_layer(first: tuple, second: tuple) -> tuple[int | None, str]:
    """(index, step) of the first layer whose diff_id differs between two layer lists (engine.Layer or
    LayerRef: both have diff_id and a step), or (None, "") when they are equal."""
    for index, (a, b) in enumerate(zip_longest(first, second)):
        if a is None or b is None or a.diff_id != b.diff_id:
            layer = b or a
            return index, getattr(layer, "created_by", None) or getattr(layer, "step", "")
    return None, ""


def config_differences(first: object, second: object, prefix: str = "") -> tuple[str, ...]:
    """Dotted paths of the values that differ, e.g. ("config.Hostname", "history[3].comment")."""
    if isinstance(first, dict) and isinstance(second, dict):
        paths: list[str] = []
        for key in sorted(first.keys() | second.keys()):
            path = f"{prefix}.{key}" if prefix else key
            if key not in first or key not in second:
                paths.append(path)
            else:
                paths += config_differences(first[key], second[key], path)
        return tuple(paths)
    if isinstance(first, list) and isinstance(second, list) and len(first) == len(second):
        paths = []
        for index, (a, b) in enumerate(zip(first, second)):
            paths += config_differences(a, b, f"{prefix}[{index}]")
        return tuple(paths)
    return () if first == second else (prefix,)


# -- two clean builds ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoBuilds:
    image_ids: tuple[str, str]
    # docker-archives of both builds; empty when the ids matched and saving them was not asked for.
    archives: tuple[Path, ...] = ()
    durations_s: tuple[float, float] = field(default=(0.0, 0.0))

    @property
    def identical(self) -> bool:
        return self.image_ids[0] == self.image_ids[1]


def build_twice(request, base_archives: tuple[Path, ...], workdir: Path, engine,
                save_when_identical: bool = True) -> TwoBuilds:
    """Build `request` twice with `engine` (a StorageEngine), each time in a new, empty private storage
    of it holding only the base images. Both results are saved as docker-archives under workdir for
    comparison; with save_when_identical=False only when their ids differ (saving multi-GB images twice
    costs minutes)."""
    workdir.mkdir(parents=True, exist_ok=True)
    engines, image_ids, durations = [], [], []
    try:
        for run in (1, 2):
            fresh = engine.private_storage(workdir / f"storage-{run}")
            engines.append(fresh)
            for base in base_archives:
                fresh.load(base)
            result = fresh.build(replace(request, no_cache=True))
            image_ids.append(result.image_id)
            durations.append(result.duration_s)
        archives = []
        if save_when_identical or image_ids[0] != image_ids[1]:
            for run, (fresh, image_id) in enumerate(zip(engines, image_ids), start=1):
                archive = workdir / f"build-{run}.docker.tar"
                fresh.save(image_id, archive)
                archives.append(archive)
    finally:
        for fresh in engines:
            discard_storage(fresh, fresh.storage_dir)
    return TwoBuilds(tuple(image_ids), tuple(archives), tuple(durations))


def discard_storage(engine, storage: Path) -> None:
    try:
        engine.reset_storage()
    except BuildFailure:
        pass  # removing the directory below is what matters; report that if it fails
    try:
        shutil.rmtree(storage)
    except OSError as error:
        raise BuildFailure(f"could not remove build storage {storage}: {error}") from None
