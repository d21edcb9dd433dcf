"""After buildah builds, put the canonical form of the image (canonical.py) into buildah's storage: the
image builder tags, smoke-tests, delivers and locks. The engine's own image stays as it is, untagged:
its layers are buildah's cache for the next build.

Layers that need no rewriting are the base's, and those whose canonical form an earlier export
recorded (the index, keyed by the engine's diff_id). Every other layer, one at a time, in order:
  1. read its tar through `buildah push` of the engine's image to an OCI layout (gzip level 0) in which
     every other layer is an empty placeholder, so buildah writes this one layer only (the engine's
     public interface: its storage's own files are never read);
  2. rewrite it into its canonical, uncompressed tar in a second layout;
  3. `buildah pull oci:` that layout as the image of the canonical layers so far (placeholders for those
     below, which the storage already holds by diff_id: buildah reuses them without opening the empty
     file), then empty the tar.
So no more than one layer is in flight on top of the storage, whatever the image's size. Last, the
whole canonical image is pulled the same way, all of it placeholders, and the images of the partial
layer lists go. If a recorded layer is no longer in the storage, a pull fails on its placeholder and
the export runs again rewriting every layer. A no-op rebuild finds the engine's image id in the index
and the canonical image in storage: nothing is read.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.engine.image_names import image_names
from builder.engine.process import run_quiet
from builder.errors import BuildFailure
from builder.files import write_atomic
from builder.oci import canonical
from builder.oci.layout import Layout, digest_of, scratch_layout

_REF = "canonical"


@dataclass(frozen=True)
class Export:
    image_id: str
    layers_rewritten: int = 0
    bytes_rewritten: int = 0  # canonical tar bytes written
    seconds: float = 0.0


class CanonicalIndex:
    """What earlier exports made: engine diff_id -> canonical layer, engine image id -> canonical id.
    Small files under `root`, one per key, written atomically; a stale entry costs one retry, never a
    wrong image (the pull checks every layer it reads, and the config fixes the id)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _file(self, kind: str, key: str) -> Path:
        return self.root / canonical.FORMAT / kind / key.removeprefix("sha256:")

    def layer(self, native_diff_id: str, drop_stubs: bool) -> tuple[str, int] | None:
        path = self._file("layers", canonical.layer_cache_key(native_diff_id, drop_stubs))
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return data["diff_id"], data["size"]

    def record_layer(self, native_diff_id: str, drop_stubs: bool, diff_id: str, size: int) -> None:
        path = self._file("layers", canonical.layer_cache_key(native_diff_id, drop_stubs))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"diff_id": diff_id, "size": size}) + "\n")

    def image(self, native_id: str) -> str | None:
        path = self._file("images", native_id)
        return path.read_text().strip() if path.is_file() else None

    def record_image(self, native_id: str, canonical_id: str) -> None:
        path = self._file("images", native_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, canonical_id + "\n")


@dataclass(frozen=True)
class NativeImage:
    """The engine's image as inspected: config, and each layer's diff_id, size and step."""

    image_id: str
    config: dict
    diff_ids: tuple[str, ...]
    sizes: tuple[int | None, ...]
    steps: tuple[str, ...]
    base_layers: int  # leading layers that are the base image's own, never rewritten
    base_history: int  # leading history entries that are the base's


def export(buildah: Sequence[str], native: NativeImage, index: CanonicalIndex, workdir: Path, name: str,
           progress: Callable[[str], None] | None = None) -> Export:
    """The canonical image of `native`, in buildah's storage under `name` (`buildah` is the command and
    its global options); its id, and what the rewrite cost. `progress` hears of each rewritten layer."""
    started = time.monotonic()
    try:
        result = _export(buildah, native, index, workdir, name, True, progress)
    except BuildFailure:
        result = _export(buildah, native, index, workdir, name, False, progress)
    index.record_image(native.image_id, result.image_id)
    return Export(result.image_id, result.layers_rewritten, result.bytes_rewritten,
                  round(time.monotonic() - started, 1))


def _export(buildah: Sequence[str], native: NativeImage, index: CanonicalIndex, workdir: Path, name: str,
            reuse: bool, progress: Callable[[str], None] | None) -> Export:
    drop = _drops(native)
    layers = _known_layers(native, drop, index if reuse else None)
    rewritten = written = 0
    partial_images: list[str] = []
    source = _LayerSource(buildah, native, workdir)
    with scratch_layout(workdir, "canonical") as layout:
        for diff_id, _ in layers.values():
            layout.add_placeholder(diff_id)  # in the storage already
        try:
            clock = time.monotonic()
            for i in _unknown_layers(native, layers):
                made, read_from = _rewrite(source, i, layout, drop[i])
                _resolve(native, drop, layers, i, (made.diff_id, made.size))
                rewritten, written = rewritten + 1, written + made.size
                done = time.monotonic()
                if i < len(native.diff_ids) - 1:  # the top layer goes in with the whole image, below
                    below = [layers[j] for j in range(i + 1)]
                    config = canonical.prefix_config(canonical.canonical_config(
                        native.config, [diff_id for diff_id, _ in below], native.base_history), i + 1)
                    partial_images.append(_import(buildah, layout, config, below, workdir,
                                                  f"layers 1-{i + 1} of the canonical form of {native.image_id}"))
                    layout.add_placeholder(made.diff_id)  # stored now: a placeholder from here on
                if progress:
                    stored = "" if i == len(native.diff_ids) - 1 else f", imported {time.monotonic() - done:.0f} s"
                    progress(f"canonical layer {i + 1}/{len(native.diff_ids)}: {made.size / 1e9:.2f} GB, rewritten "
                             f"{done - clock:.0f} s from {read_from}{stored}")
                clock = time.monotonic()
            whole = [layers[i] for i in range(len(native.diff_ids))]
            config = _config(native, layers)
            names_before = image_names(buildah, digest_of(config))
            image_id = _import(buildah, layout, config, whole, workdir, f"the canonical form of {native.image_id}")
            if progress:
                progress(f"canonical image {image_id} imported in {time.monotonic() - clock:.0f} s")
        finally:
            for partial in partial_images:
                subprocess.run([*buildah, "rmi", partial], capture_output=True, stdin=subprocess.DEVNULL)
    # The pull names the image after the layout's path: give it `name` instead. Only the names the pull
    # added go (buildah stores `name` qualified, e.g. with localhost/, so it is kept by value).
    added = image_names(buildah, image_id) - names_before
    run_quiet([*buildah, "tag", image_id, name], f"buildah tag {image_id} {name}")
    for extra in added - {name, _qualified(name)}:
        run_quiet([*buildah, "rmi", extra], f"removing the name {extra}")
    for i, (diff_id, size) in layers.items():
        if i >= native.base_layers:
            index.record_layer(native.diff_ids[i], drop[i], diff_id, size)
    return Export(image_id, rewritten, written)


def _rewrite(source: _LayerSource, i: int, layout: Layout, drop_stubs: bool) -> tuple[canonical.CanonicalLayer, str]:
    """Layer `i` of the engine's image rewritten into `layout` under its canonical diff_id (the layout's
    writer names the blob by what it hashed), and where it was read from."""
    return source.rewrite(i, layout.blob_writer, drop_stubs)


def _config(native: NativeImage, layers: dict[int, tuple[str, int]]) -> bytes:
    """The canonical config once every layer's canonical diff_id is in `layers` (by position)."""
    return canonical.canonical_config(native.config, [layers[i][0] for i in range(len(native.diff_ids))],
                                      native.base_history)


def _import(buildah: Sequence[str], layout: Layout, config: bytes, layers: list[tuple[str, int]], workdir: Path,
            what: str) -> str:
    """`buildah pull` the image of `config` and `layers` from `layout`, whose blobs hold each layer's
    tar or, for one the storage already holds, an empty placeholder; its id."""
    image_id = digest_of(config)
    manifest = layout.write_image(
        config, [{"mediaType": canonical.LAYER_MEDIA_TYPE, "digest": d, "size": s} for d, s in layers], _REF)
    try:
        # Pulled by its path relative to `workdir`: buildah names the image after the path it is given,
        # and a path with upper case or a trailing "_" (pytest's, tempfile's) is not a valid name.
        pulled = run_quiet([*buildah, "pull", "--quiet", f"oci:{layout.root.name}:{_REF}"], f"importing {what}",
                           cwd=workdir).strip().splitlines()
    finally:
        for blob in (image_id, manifest.digest):
            layout.remove_blob(blob)
    got = pulled[-1] if pulled else ""
    if ("sha256:" + got.removeprefix("sha256:")) != image_id:
        raise BuildFailure(f"buildah stored {what} as {got or 'nothing'}, expected {image_id}")
    return image_id


class _Discard:
    """A sink that keeps nothing: the rewrite's own hashing gives the diff_id."""

    def write(self, data: bytes) -> int:
        return len(data)


def canonical_config(buildah: Sequence[str], native: NativeImage, workdir: Path,
                     known_index: CanonicalIndex | None = None) -> bytes:
    """The config (and so the id) the canonical form of `native` would have, computed without storing
    it: each layer is read (as the export reads it) and rewritten into a hash only. What `builder verify
    --against-lock` compares, with one layer in flight. A layer `known_index` holds is looked up
    instead: its canonical form is a function of the engine's layer bytes."""
    drop = _drops(native)
    layers = _known_layers(native, drop, known_index)
    source = _LayerSource(buildah, native, workdir)
    for i in _unknown_layers(native, layers):
        made, _ = source.rewrite(i, lambda: contextlib.nullcontext(_Discard()), drop[i])
        _resolve(native, drop, layers, i, (made.diff_id, made.size))
    return _config(native, layers)


def _drops(native: NativeImage) -> list[bool]:
    """Per layer: whether its engine stubs go (RUN steps above the base)."""
    return [i >= native.base_layers and canonical.is_run_step(step) for i, step in enumerate(native.steps)]


def _known_layers(native: NativeImage, drop: list[bool], index: CanonicalIndex | None) -> dict[int, tuple[str, int]]:
    """Layers that need no rewriting, by position: (canonical diff_id, size). The base's are kept as
    they are; others are those whose canonical form `index` recorded."""
    known: dict[int, tuple[str, int]] = {}
    for i, diff_id in enumerate(native.diff_ids):
        if i < native.base_layers:
            known[i] = (diff_id, native.sizes[i] or 0)
        elif index is not None and (recorded := index.layer(diff_id, drop[i])) is not None:
            known[i] = recorded
    return known


def _unknown_layers(native: NativeImage, layers: dict[int, tuple[str, int]]) -> Iterator[int]:
    """Each position not (yet) in `layers`, in order. Checked as the loop goes: the caller resolves each
    position, and its repeats, before the next."""
    for i in range(len(native.diff_ids)):
        if i not in layers:
            yield i


class _LayerSource:
    """Reads the engine's layers for the rewrite, one `buildah push` each."""

    def __init__(self, buildah: Sequence[str], native: NativeImage, workdir: Path) -> None:
        self.buildah, self.native, self.workdir = buildah, native, workdir

    def rewrite(self, i: int, open_sink: Callable[[], contextlib.AbstractContextManager[IO[bytes]]],
                drop_stubs: bool) -> tuple[canonical.CanonicalLayer, str]:
        """Layer `i` rewritten into the sink `open_sink` opens, and where it was read from (for the
        progress line)."""
        with _pushed_layer(self.buildah, self.native, self.workdir, i) as stream, open_sink() as sink:
            return canonical.rewrite_layer(stream, sink, drop_stubs, self.native.diff_ids[i]), "buildah push"


@contextlib.contextmanager
def _pushed_layer(buildah: Sequence[str], native: NativeImage, workdir: Path, i: int) -> Iterator[IO[bytes]]:
    """Layer `i` of the engine's image as `buildah push` writes it, into a scratch OCI layout in which
    every layer with another diff_id is an empty placeholder buildah reuses, so it writes this one only."""
    with scratch_layout(workdir, "native") as layout:
        for diff_id in set(native.diff_ids) - {native.diff_ids[i]}:
            layout.add_placeholder(diff_id)
        run_quiet([*buildah, "push", "--quiet", "--compression-format", "gzip", "--compression-level", "0",
                   native.image_id, f"oci:{layout.root}:{_REF}"], f"exporting layer {i + 1} of {native.image_id}")
        pushed = layout.manifest(_REF)["layers"]
        if len(pushed) != len(native.diff_ids):
            raise BuildFailure(f"buildah wrote {len(pushed)} layers of {native.image_id}, its config lists "
                               f"{len(native.diff_ids)}")
        source = layout.blob_path(pushed[i]["digest"])
        if not source.is_file() or source.stat().st_size == 0:
            raise BuildFailure(f"buildah did not write layer {i + 1} ({native.diff_ids[i]}) of {native.image_id}")
        with _open_pushed(source, pushed[i]) as stream:
            yield stream


def _resolve(native: NativeImage, drop: list[bool], layers: dict[int, tuple[str, int]], i: int,
             made: tuple[str, int]) -> None:
    """Layer `i`'s canonical form is `made`, and so is that of every layer that repeats it (the same
    engine diff_id, its stubs dropped alike: two identical RUN steps)."""
    for j, diff_id in enumerate(native.diff_ids):
        if diff_id == native.diff_ids[i] and drop[j] == drop[i]:
            layers.setdefault(j, made)


def _open_pushed(source: Path, descriptor: dict):
    """A pushed layer blob as its uncompressed tar stream (buildah frames it as gzip level 0)."""
    opener = gzip.open if descriptor.get("mediaType", "").endswith("gzip") else open
    return opener(source, "rb")


def _qualified(name: str) -> str:
    """`name` as buildah lists it: a name with no registry part lives under localhost/."""
    first = name.split("/", 1)[0]
    has_registry = "/" in name and ("." in first or ":" in first or first == "localhost")
    return name if has_registry else f"localhost/{name}"
