"""A content-addressed OCI image layout (oci-layout, index.json, blobs/sha256/<hex>): the one module
that reads and writes them.

A blob is written under a temporary name in its own directory while it is hashed, checked against the
digest it should have (when the caller knows it), fsynced and only then renamed to its digest: a
killed or failed write leaves at most a temporary file, never a blob whose name lies about its bytes.
Manifests, configs and the index are JSON with sorted keys and no spaces, so equal content gives equal
digests.

Refs are names in the index (entries carrying the ref.name annotation), each pointing at an image's
manifest. Every change to them is one index write, under a lock file, of a whole new index.json
(temporary file, fsync, rename): several processes share one layout, a name set together with others
moves with them or not at all, and a writer killed midway leaves the old index whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure
from builder.files import TEMP_SUFFIX, HashingWriter, locked, write_atomic

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
_LAYOUT_FILE = '{"imageLayoutVersion":"1.0.0"}'
_INDEX = "index.json"
# Held around every read-modify-write of the index (freed by the kernel when its holder dies).
_INDEX_LOCK = "index.lock"
_CHUNK = 1 << 20


def hex_of(digest: str) -> str:
    """The hex part of a sha256 digest ("sha256:ab…" -> "ab…")."""
    return digest.removeprefix("sha256:")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def deterministic_json(value: object) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes a manifest, config or index is stored and hashed as."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class LayoutError(BuildFailure):
    """A layout that is not what it should be: missing, unreadable, or a blob that fails its digest."""


@dataclass(frozen=True)
class Descriptor:
    digest: str
    size: int

    def as_json(self, media_type: str, annotations: dict[str, str] | None = None) -> dict:
        entry: dict = {"mediaType": media_type, "digest": self.digest, "size": self.size}
        if annotations:
            entry["annotations"] = dict(annotations)
        return entry


class _VerifyingReader:
    """A blob read front to back; at its end, its bytes must hash to the blob's name."""

    def __init__(self, handle: IO[bytes], digest: str) -> None:
        self._handle, self._expected, self._digest = handle, digest, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._digest.update(data)
        if not data and size != 0 and "sha256:" + self._digest.hexdigest() != self._expected:
            raise LayoutError(f"blob {self._expected} reads as sha256:{self._digest.hexdigest()}")
        return data

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "_VerifyingReader":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Layout:
    """An OCI image layout at `root`. `create` makes one (or reuses it); plain construction reads one."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"

    @classmethod
    def create(cls, root: Path) -> "Layout":
        """`root` as a layout: the directory, oci-layout and an empty index.json, where missing."""
        layout = cls(root)
        layout.blobs.mkdir(parents=True, exist_ok=True)
        if not (layout.root / "oci-layout").is_file():
            write_atomic(layout.root / "oci-layout", _LAYOUT_FILE)
        if not (layout.root / _INDEX).is_file():
            with layout._index_lock():  # never over an index another process wrote meanwhile
                if not (layout.root / _INDEX).is_file():
                    layout.write_index([])
        return layout

    # -- blobs ----------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
            raise LayoutError(f"{self.root}: not a sha256 digest: {digest!r}")
        return self.blobs / hexdigest

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    @contextlib.contextmanager
    def blob_writer(self, expected: str | None = None) -> Iterator[HashingWriter]:
        """Write a blob through the yielded stream. On leaving the block it is fsynced and renamed to its
        digest, after checking it is `expected` where given; on an error inside the block, or a digest
        that does not match, the temporary file goes and no blob is made. The blob's digest and size
        are on the writer afterwards (`writer.digest`, `writer.size`)."""
        if expected is not None:
            self.blob_path(expected)  # a malformed digest fails before anything is written
        self.blobs.mkdir(parents=True, exist_ok=True)
        temporary = self.blobs / f".{secrets.token_hex(8)}{TEMP_SUFFIX}"
        try:
            with temporary.open("xb") as handle:
                writer = HashingWriter(handle)
                yield writer
                handle.flush()
                os.fsync(handle.fileno())
            if expected is not None and writer.digest != expected:
                raise LayoutError(f"a blob written as {expected} hashes to {writer.digest}; not stored")
            os.replace(temporary, self.blob_path(writer.digest))
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fsync_directory(self.blobs)

    def write_blob(self, data: bytes, expected: str | None = None) -> Descriptor:
        with self.blob_writer(expected) as writer:
            writer.write(data)
        return Descriptor(writer.digest, writer.size)

    def write_blob_from(self, source: IO[bytes], expected: str | None = None) -> Descriptor:
        """Stream `source` (read to its end) into a blob."""
        with self.blob_writer(expected) as writer:
            while chunk := source.read(_CHUNK):
                writer.write(chunk)
        return Descriptor(writer.digest, writer.size)

    def open_blob(self, digest: str, verify: bool = False) -> IO[bytes]:
        """The blob's bytes as a stream; with `verify`, reading to the end raises when they do not hash to
        `digest` (a stream that is not read to its end is not checked)."""
        path = self.blob_path(digest)
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise LayoutError(f"{self.root}: no blob {digest}") from None
        return _VerifyingReader(handle, digest) if verify else handle  # type: ignore[return-value]

    def read_blob(self, digest: str, verify: bool = True) -> bytes:
        path = self.blob_path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise LayoutError(f"{self.root}: no blob {digest}") from None
        if verify and digest_of(data) != digest:
            raise LayoutError(f"{self.root}: blob {digest} reads as {digest_of(data)}")
        return data

    def read_json(self, digest: str, verify: bool = True) -> dict:
        try:
            return json.loads(self.read_blob(digest, verify))
        except ValueError as error:
            raise LayoutError(f"{self.root}: blob {digest} is not JSON: {error}") from None

    def write_json(self, value: object) -> Descriptor:
        return self.write_blob(deterministic_json(value))

    def remove_blob(self, digest: str) -> None:
        self.blob_path(digest).unlink(missing_ok=True)

    # -- index and manifests --------------------------------------------------------------------

    def index(self) -> dict:
        try:
            return json.loads((self.root / _INDEX).read_text())
        except FileNotFoundError:
            raise LayoutError(f"{self.root}: not an OCI image layout (no index.json)") from None
        except ValueError as error:
            raise LayoutError(f"{self.root}: index.json is not JSON: {error}") from None

    def write_index(self, manifests: list[dict]) -> None:
        """The whole index at once; for a scratch layout of one writer (a shared one's refs: update_refs)."""
        write_atomic(self.root / _INDEX,
                     deterministic_json({"schemaVersion": 2, "manifests": manifests}).decode())

    def manifest_descriptor(self, ref: str | None = None) -> dict:
        """The index's one manifest entry, or the one whose ref annotation is `ref`."""
        entries = self.index().get("manifests") or []
        if ref is not None:
            entries = [m for m in entries if (m.get("annotations") or {}).get(REF_ANNOTATION) == ref]
        if len(entries) != 1:
            named = f" named {ref}" if ref is not None else ""
            raise LayoutError(f"{self.root}: holds {len(entries)} images{named}, not one")
        return entries[0]

    def manifest(self, ref: str | None = None, verify: bool = True) -> dict:
        return self.read_json(self.manifest_descriptor(ref)["digest"], verify)

    def write_manifest(self, config: bytes, layers: list[dict]) -> Descriptor:
        """Store `config` and a manifest naming it and `layers` (descriptors of blobs already here),
        leaving the index alone. The manifest's descriptor: one image, one digest."""
        config_blob = self.write_blob(config)
        return self.write_json({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                                "config": config_blob.as_json(CONFIG_MEDIA_TYPE), "layers": layers})

    def write_image(self, config: bytes, layers: list[dict], ref: str | None = None) -> Descriptor:
        """write_manifest, then make the index list that manifest alone, under `ref` where given (a
        scratch layout handed to a reader). The manifest's descriptor."""
        manifest = self.write_manifest(config, layers)
        annotations = {REF_ANNOTATION: ref} if ref is not None else None
        self.write_index([manifest.as_json(MANIFEST_MEDIA_TYPE, annotations)])
        return manifest

    # -- refs: names in the index ---------------------------------------------------------------

    def refs(self) -> dict[str, Descriptor]:
        """Each name the index holds -> its manifest; none where the layout has no index yet."""
        if not (self.root / _INDEX).is_file():
            return {}
        return {name: Descriptor(entry["digest"], entry["size"]) for entry in self.index().get("manifests") or []
                if (name := (entry.get("annotations") or {}).get(REF_ANNOTATION))}

    def ref_image(self, name: str) -> str | None:
        """The image id (config digest) that `name` points at, None when no ref has that name."""
        manifest = self.refs().get(name)
        return None if manifest is None else self._config_of(manifest)

    def ref_images(self) -> dict[str, str]:
        """Each name the index holds -> the image id (config digest) it points at."""
        refs = self.refs()
        configs = {manifest: self._config_of(manifest) for manifest in set(refs.values())}
        return {name: configs[manifest] for name, manifest in refs.items()}

    def ref_names(self, image_id: str | None = None) -> tuple[str, ...]:
        """Every ref's name, or those pointing at `image_id`; sorted."""
        if image_id is None:
            return tuple(sorted(self.refs()))
        return tuple(sorted(name for name, image in self.ref_images().items() if image == image_id))

    def set_refs(self, names: Iterable[str], manifest: Descriptor) -> None:
        """Point every name at `manifest`, all in one index write."""
        self.update_refs({name: manifest for name in names})

    def remove_refs(self, names: Iterable[str]) -> None:
        """Take the names out of the index, in one write (names it lacks are no error)."""
        self.update_refs({name: None for name in names})

    def update_refs(self, changes: Mapping[str, Descriptor | None]) -> None:
        """One index write: each name of `changes` pointed at its manifest, or removed where None; every
        other entry kept as it is. Nothing is written when nothing changes."""
        if not changes or (not (self.root / _INDEX).is_file() and not any(changes.values())):
            return
        with self._index_lock():
            for left in self.root.glob(f".{_INDEX}.*{TEMP_SUFFIX}"):
                left.unlink(missing_ok=True)  # a writer killed under the lock: it is gone now
            manifests = (self.index().get("manifests") or []) if (self.root / _INDEX).is_file() else []
            kept = [entry for entry in manifests
                    if (entry.get("annotations") or {}).get(REF_ANNOTATION) not in changes]
            named = [manifest.as_json(MANIFEST_MEDIA_TYPE, {REF_ANNOTATION: name})
                     for name, manifest in changes.items() if manifest is not None]
            # By name (entries without one first, as they were): equal refs, equal index bytes.
            updated = sorted(kept + named, key=lambda entry: (entry.get("annotations") or {}).get(REF_ANNOTATION, ""))
            if updated != manifests:
                self.write_index(updated)

    def _config_of(self, manifest: Descriptor) -> str:
        try:
            return self.read_json(manifest.digest)["config"]["digest"]
        except (KeyError, TypeError):
            raise LayoutError(f"{self.root}: manifest {manifest.digest} names no config") from None

    @contextlib.contextmanager
    def _index_lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with locked(self.root / _INDEX_LOCK):
            yield


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def scratch_layout(workdir: Path, kind: str) -> Iterator[Layout]:
    """A fresh, private, empty layout under `workdir`, removed afterwards. Its name is always a valid
    image name (lower-case hex), unlike tempfile's: buildah names an image pulled from it after it."""
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / f"builder-{kind}-{secrets.token_hex(8)}"
    root.mkdir(mode=0o700)
    try:
        yield Layout.create(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def linked_layout(store: Layout, workdir: Path, digests: Sequence[str]) -> Iterator[Layout]:
    """A scratch layout under `workdir` holding `store`'s blobs `digests` as hard links (no byte copied;
    `workdir` must be on the store's filesystem): an image of the store's handed to a reader with an
    index of its own."""
    with scratch_layout(workdir, "view") as view:
        for digest in dict.fromkeys(digests):
            os.link(store.blob_path(digest), view.blob_path(digest))
        yield view
