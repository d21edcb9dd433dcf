"""The canonical form of an image: what every buildah version writes alike, so the image id depends on the
files and the Dockerfile, not on the engine's version (docs/engines.md, "Canonical layers").

Measured between buildah 1.28.2 (bookworm) and 1.39.3 (trixie) on the same inputs: the same entries in
the same order with the same contents, owners and times, but
  - the tar header's mode field: 1.28 writes the file-type bits into it (0o100755), 1.39 only the
    permission bits (0o755);
  - the empty /etc/hostname a RUN step leaves behind (a mount point for the engine's own file): 0755
    under 1.28, 0644 under 1.39;
  - the history: 1.28 writes "FROM <intermediate id>" comments, the content digest in
    "COPY file:<hex> in DEST" is computed differently, and 1.39 ends a `RUN --mount=type=bind,...`
    step's created_by with ":sha256:<digest of the mounted source>".
So a canonical layer has, per entry in the engine's order: name, type, permission bits only, numeric
uid/gid with no user or group names, integer mtime, size, link target, device numbers and extended
attributes (SCHILY.xattr.*, sorted), written as POSIX pax by Python's tarfile (a pax header only where
a value does not fit ustar). Empty /etc/hostname, /etc/hosts and /etc/resolv.conf in a layer a RUN step
made are left out: a RUN step cannot write those paths (the engine mounts its own files there), so
such an entry is only the engine's mount point. The base image's layers are never rewritten.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from builder.errors import BuildFailure
from builder.files import HashingWriter

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CHUNK = 1 << 20
ENGINE_STUBS = frozenset({"etc/hostname", "etc/hosts", "etc/resolv.conf"})
_XATTR = "SCHILY.xattr."
_COPY_DIGEST = re.compile(r"#\(nop\) (COPY|ADD) (file|dir|multi):[0-9a-f]{64} in ")
# 1.39 ends a RUN step with a bind mount with ":sha256:<digest of what was mounted>"; 1.28 does not.
_RUN_MOUNT_DIGEST = re.compile(r"(--mount=\S.*):sha256:[0-9a-f]{64}$", re.DOTALL)
_HISTORY_KEYS = ("created", "created_by", "empty_layer")


class ForwardReader:
    """A stream read front to back, for tarfile's random-access mode: a forward seek reads up to the
    target. (tarfile's own streaming mode copies its buffer on every read: 20 MB/s where this gives
    the disk's speed.)"""

    def __init__(self, source: IO[bytes]) -> None:
        self.source, self.position = source, 0

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.position += len(data)
        return data

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self.position + offset
        if target < self.position:
            raise tarfile.ReadError("the layer stream cannot go backwards")
        while self.position < target and self.read(min(_CHUNK, target - self.position)):
            pass
        return self.position


class _HashingReader(ForwardReader):
    """A forward reader that hashes every byte, even those tarfile skips with a forward seek."""

    def __init__(self, source: IO[bytes]) -> None:
        super().__init__(source)
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.digest.update(data)
        return data

    def drain(self) -> str:
        while self.read(_CHUNK):
            pass
        return "sha256:" + self.digest.hexdigest()


@dataclass(frozen=True)
class CanonicalLayer:
    diff_id: str
    size: int
    dropped: tuple[str, ...] = ()  # engine stubs left out


def is_run_step(created_by: str) -> bool:
    """buildah records COPY, ADD and metadata steps as "/bin/sh -c #(nop) ..."; anything else ran."""
    return "#(nop)" not in created_by


def _entry_name(member: tarfile.TarInfo) -> str:
    return member.name.removeprefix("./").rstrip("/")


def written_order(name: str) -> tuple[str, ...]:
    """The order of the entries in a layer the builder writes itself (builder/oci/): by path, one
    component at a time, so a directory comes right before what it holds. (A layer rewritten from the
    engine keeps the engine's order, above.)"""
    return tuple(name.split("/"))


def canonical_entry(member: tarfile.TarInfo) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(member.name)
    entry.type = member.type
    entry.mode = member.mode & 0o7777
    entry.uid, entry.gid = member.uid, member.gid
    entry.uname = entry.gname = ""
    entry.mtime = int(member.mtime)
    entry.size = member.size if member.isreg() else 0
    entry.linkname = member.linkname
    entry.devmajor, entry.devminor = member.devmajor, member.devminor
    entry.pax_headers = {key: member.pax_headers[key] for key in sorted(member.pax_headers)
                         if key.startswith(_XATTR)}
    return entry


def rewrite_layer(source: IO[bytes], sink: IO[bytes], drop_stubs: bool, native_diff_id: str) -> CanonicalLayer:
    """Read one layer tar from `source` (a stream), write its canonical form to `sink`. The input must be
    exactly the layer `native_diff_id` names: a short or damaged stream is an error, not a smaller layer."""
    writer = HashingWriter(sink)
    reader = _HashingReader(source)
    dropped: list[str] = []
    try:
        with tarfile.TarFile(fileobj=reader, mode="r", copybufsize=_CHUNK) as tar_in, \
                tarfile.TarFile(fileobj=writer, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                                errors="surrogateescape", copybufsize=_CHUNK) as tar_out:
            for member in tar_in:
                if drop_stubs and member.isreg() and member.size == 0 and _entry_name(member) in ENGINE_STUBS:
                    dropped.append(_entry_name(member))
                    continue
                entry = canonical_entry(member)
                tar_out.addfile(entry, tar_in.extractfile(member) if member.isreg() else None)
    except tarfile.TarError as error:
        raise BuildFailure(f"layer {native_diff_id}: the engine's export is no readable tar: {error}") from None
    read = reader.drain()
    if read != native_diff_id:
        raise BuildFailure(f"layer {native_diff_id}: the engine's export reads as {read}; not rewritten")
    return CanonicalLayer(writer.digest, writer.size, tuple(dropped))


def layer_descriptors(diff_ids: Sequence[str], sizes: Mapping[str, int]) -> list[dict]:
    """A manifest's layer descriptors for canonical layers: uncompressed, so each blob's digest is its diff_id."""
    return [{"mediaType": LAYER_MEDIA_TYPE, "digest": d, "size": sizes[d]} for d in diff_ids]


def canonical_history_entry(entry: Mapping[str, object]) -> dict:
    """created, created_by (the engine-computed digests of COPY's source and of a RUN step's mounts left
    out: the inputs hash covers both) and empty_layer only."""
    kept = {key: entry[key] for key in _HISTORY_KEYS if key in entry}
    created_by = kept.get("created_by")
    if isinstance(created_by, str):
        created_by = _COPY_DIGEST.sub(r"#(nop) \1 \2 in ", created_by)
        if is_run_step(created_by):
            created_by = _RUN_MOUNT_DIGEST.sub(r"\1", created_by)
        kept["created_by"] = created_by
    return kept


def canonical_config(native: Mapping[str, object], diff_ids: Sequence[str], base_history: int) -> bytes:
    """The image config with the canonical layers' diff_ids and this build's history entries in canonical
    form (the base's own entries as the base has them), serialised with sorted keys and no spaces."""
    config = copy.deepcopy(dict(native))
    config["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    history = list(config.get("history") or [])
    config["history"] = history[:base_history] + [canonical_history_entry(h) for h in history[base_history:]]
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
