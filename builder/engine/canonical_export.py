"""After buildah builds, put the canonical form of the image (canonical.py) into buildah's storage: the
image builder tags, smoke-tests, delivers and locks. The engine's own image stays as it is, untagged:
its layers are buildah's cache for the next build.

  1. `buildah push` the engine's image to an OCI layout (gzip level 0: no compression work), with an
     empty placeholder for each layer that needs no rewriting: the base's layers, and layers whose
     canonical form an earlier export recorded (the index, keyed by the engine's diff_id);
  2. rewrite each pushed layer into its canonical, uncompressed tar, and write the canonical config and
     an OCI manifest; each placeholder is renamed to the canonical diff_id it stands for;
  3. `buildah pull oci:` the layout: buildah reuses every layer its storage holds by diff_id without
     opening the (empty) file, so only rewritten layers are stored. If a recorded layer is no longer in
     the storage, the pull fails on its placeholder and the export runs again rewriting every layer.
A no-op rebuild finds the engine's image id in the index and the canonical image in storage: no push.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engine import canonical
from builder.engine.process import run_quiet
from builder.errors import BuildFailure
from builder.files import write_atomic

_REF = "canonical"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"


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


def export(buildah: Sequence[str], native: NativeImage, index: CanonicalIndex, workdir: Path, name: str) -> Export:
    """The canonical image of `native`, in buildah's storage under `name` (`buildah` is the command and
    its global options); its id, and what the rewrite cost."""
    started = time.monotonic()
    try:
        result = _export(buildah, native, index, workdir, name, reuse=True)
    except BuildFailure:
        result = _export(buildah, native, index, workdir, name, reuse=False)
    index.record_image(native.image_id, result.image_id)
    return Export(result.image_id, result.layers_rewritten, result.bytes_rewritten,
                  round(time.monotonic() - started, 1))


def _export(buildah: Sequence[str], native: NativeImage, index: CanonicalIndex, workdir: Path, name: str,
            reuse: bool) -> Export:
    with _scratch_layout(workdir, "canonical") as layout:
        blobs = layout / "blobs" / "sha256"
        drop = _drops(native)
        known = _known_layers(native, drop, index if reuse else None)
        pushed = _push_unknown(buildah, native, layout, known, "rewriting")
        layers: list[tuple[str, int]] = []
        rewritten = written = 0
        for i, descriptor in enumerate(pushed):
            if i in known:
                layers.append(known[i])
                continue
            made = _rewrite(blobs, descriptor, drop[i], native.diff_ids[i])
            layers.append((made.diff_id, made.size))
            rewritten, written = rewritten + 1, written + made.size
        for blob in list(blobs.iterdir()):
            if blob.stat().st_size == 0 or blob.name not in {_hex(d) for d, _ in layers}:
                blob.unlink()  # the engine's blobs and placeholders: replaced below by canonical names
        for diff_id, _ in layers:
            (blobs / _hex(diff_id)).touch(exist_ok=True)
        config = canonical.canonical_config(native.config, [d for d, _ in layers], native.base_history)
        image_id = "sha256:" + hashlib.sha256(config).hexdigest()
        (blobs / _hex(image_id)).write_bytes(config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": _MANIFEST,
            "config": {"mediaType": _CONFIG, "digest": image_id, "size": len(config)},
            "layers": [{"mediaType": canonical.LAYER_MEDIA_TYPE, "digest": d, "size": s} for d, s in layers],
        }, sort_keys=True, separators=(",", ":")).encode()
        manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        (blobs / _hex(manifest_digest)).write_bytes(manifest)
        _write_layout_files(layout, [{"mediaType": _MANIFEST, "digest": manifest_digest, "size": len(manifest),
                                      "annotations": {"org.opencontainers.image.ref.name": _REF}}])
        names_before = _names(buildah, image_id)
        # Pulled by its path relative to `workdir`: buildah names the image after the path it is given,
        # and a path with upper case or a trailing "_" (pytest's, tempfile's) is not a valid name.
        pulled = run_quiet([*buildah, "pull", "--quiet", f"oci:{layout.name}:{_REF}"], f"importing the canonical "
                           f"form of {native.image_id}", cwd=workdir).strip().splitlines()
        got = pulled[-1] if pulled else ""
        if ("sha256:" + got.removeprefix("sha256:")) != image_id:
            raise BuildFailure(f"buildah stored the canonical image as {got or 'nothing'}, expected {image_id}")
        # The pull names the image after the layout's path: give it `name` instead. Only the names the
        # pull added go (buildah stores `name` qualified, e.g. with localhost/, so it is kept by value).
        added = _names(buildah, image_id) - names_before
        run_quiet([*buildah, "tag", image_id, name], f"buildah tag {image_id} {name}")
        for extra in added - {name, _qualified(name)}:
            run_quiet([*buildah, "rmi", extra], f"removing the name {extra}")
        for i, (diff_id, size) in enumerate(layers):
            if i >= native.base_layers:
                index.record_layer(native.diff_ids[i], drop[i], diff_id, size)
        return Export(image_id, rewritten, written)


class _Discard:
    """A sink that keeps nothing: the rewrite's own hashing gives the diff_id."""

    def write(self, data: bytes) -> int:
        return len(data)


def canonical_config(buildah: Sequence[str], native: NativeImage, workdir: Path,
                     known_index: CanonicalIndex | None = None) -> bytes:
    """The config (and so the id) the canonical form of `native` would have, computed without storing
    it: each pushed layer is rewritten into a hash and deleted. What `builder verify --against-lock`
    compares, at the cost of one copy of the layers in flight instead of two. A layer `known_index`
    holds is looked up instead: its canonical form is a function of the engine's layer bytes."""
    with _scratch_layout(workdir, "canonical-id") as layout:
        drop = _drops(native)
        known = _known_layers(native, drop, known_index)
        pushed = _push_unknown(buildah, native, layout, known, "its canonical id")
        blobs = layout / "blobs" / "sha256"
        diff_ids = []
        for i, descriptor in enumerate(pushed):
            if i in known:
                diff_ids.append(known[i][0])
                continue
            source = blobs / _hex(descriptor["digest"])
            with _open_pushed(source, descriptor) as stream:
                diff_ids.append(canonical.rewrite_layer(stream, _Discard(), drop[i], native.diff_ids[i]).diff_id)
            source.unlink(missing_ok=True)
    return canonical.canonical_config(native.config, diff_ids, native.base_history)


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


def _push_unknown(buildah: Sequence[str], native: NativeImage, layout: Path, known: dict[int, tuple[str, int]],
                  purpose: str) -> list[dict]:
    """`buildah push` the engine's image into the empty layout `layout`, writing only the layers not in
    `known` (each known one is an empty placeholder buildah reuses by diff_id); the pushed layer
    descriptors, in order."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    _write_layout_files(layout, [])
    for i in known:
        (blobs / _hex(native.diff_ids[i])).touch()
    run_quiet([*buildah, "push", "--quiet", "--compression-format", "gzip", "--compression-level", "0",
               native.image_id, f"oci:{layout}:{_REF}"], f"exporting {native.image_id} for {purpose}")
    pushed = _read_manifest(layout)["layers"]
    if len(pushed) != len(native.diff_ids):
        raise BuildFailure(f"buildah wrote {len(pushed)} layers of {native.image_id}, its config lists "
                           f"{len(native.diff_ids)}")
    return pushed


def _open_pushed(source: Path, descriptor: dict):
    """A pushed layer blob as its uncompressed tar stream (buildah frames it as gzip level 0)."""
    opener = gzip.open if descriptor.get("mediaType", "").endswith("gzip") else open
    return opener(source, "rb")


def _rewrite(blobs: Path, descriptor: dict, drop_stubs: bool, native_diff_id: str) -> canonical.CanonicalLayer:
    source = blobs / _hex(descriptor["digest"])
    if source.stat().st_size == 0:
        raise BuildFailure(f"layer {native_diff_id} was not written (it repeats a reused layer)")
    partial = blobs / "rewrite.partial"
    with _open_pushed(source, descriptor) as stream, partial.open("wb") as sink:
        made = canonical.rewrite_layer(stream, sink, drop_stubs, native_diff_id)
    source.unlink()  # the engine's copy: not needed any more, and it is as large as the canonical one
    partial.replace(blobs / _hex(made.diff_id))
    return made


@contextlib.contextmanager
def _scratch_layout(workdir: Path, kind: str) -> Iterator[Path]:
    """A fresh, private OCI layout directory under `workdir`, removed afterwards. Its name is always a
    valid image name (lower-case hex), unlike tempfile's."""
    workdir.mkdir(parents=True, exist_ok=True)
    layout = workdir / f"builder-{kind}-{secrets.token_hex(8)}"
    layout.mkdir(mode=0o700)
    try:
        yield layout
    finally:
        shutil.rmtree(layout, ignore_errors=True)


def _qualified(name: str) -> str:
    """`name` as buildah lists it: a name with no registry part lives under localhost/."""
    first = name.split("/", 1)[0]
    has_registry = "/" in name and ("." in first or ":" in first or first == "localhost")
    return name if has_registry else f"localhost/{name}"


def _names(buildah: Sequence[str], image_id: str) -> set[str]:
    """Every name of `image_id` in the storage; none when the storage does not hold it."""
    result = subprocess.run([*buildah, "images", "--json", image_id], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, errors="replace")
    if result.returncode != 0:
        return set()
    return {name for image in json.loads(result.stdout or "[]") for name in image.get("names") or ()}


def _read_manifest(layout: Path) -> dict:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                == _REF]
    return json.loads((layout / "blobs" / "sha256" / _hex(entry["digest"])).read_bytes())


def _write_layout_files(layout: Path, manifests: list[dict]) -> None:
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")
