"""A layer's tar read straight from buildah's overlay storage (containers/storage), without `buildah
push` writing it to disk first: the canonical export (canonical_export.py) rewrites it as it is read.

When a layer goes into the storage, the storage keeps its tar-split record (overlay-layers/<id>.tar-split.gz):
one JSON line per piece of the original tar, in order. A segment line holds raw bytes (headers, padding,
the end marker); a file line names a file whose content is in the layer's directory (overlay/<id>/diff).
Joined, they give the layer's tar byte for byte: what the storage itself serves to `buildah push`.
The reader trusts none of this: the caller hashes the stream against the layer's diff_id
(canonical.rewrite_layer does), so a storage it misreads costs a fallback to `buildah push`, never a
wrong layer.
"""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import IO

_CHUNK = 1 << 20
_FILE, _SEGMENT = 1, 2  # tar-split's entry types


class UnreadableLayer(Exception):
    """The storage's files for a layer are not what its tar-split record says."""


class LayerStream:
    """A read-only stream over a layer's tar, assembled from its tar-split record and diff directory."""

    def __init__(self, tar_split: Path, diff: Path) -> None:
        self._records = gzip.open(tar_split, "rt", encoding="utf-8")
        self._pieces = _pieces(self._records, diff)
        self._piece, self._offset = b"", 0

    def read(self, size: int = -1) -> bytes:
        wanted = size if size >= 0 else None
        parts: list[bytes] = []
        while wanted is None or wanted > 0:
            if self._offset >= len(self._piece):
                self._piece, self._offset = self._next_piece(), 0
                if not self._piece:
                    break
            end = len(self._piece) if wanted is None else min(len(self._piece), self._offset + wanted)
            parts.append(self._piece[self._offset:end])
            if wanted is not None:
                wanted -= end - self._offset
            self._offset = end
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _next_piece(self) -> bytes:
        try:
            return next(self._pieces, b"")
        except (OSError, EOFError, ValueError, KeyError, TypeError) as error:  # a damaged or unknown record
            raise UnreadableLayer(f"tar-split record: {error}") from None

    def close(self) -> None:
        self._records.close()

    def __enter__(self) -> LayerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pieces(records: IO[str], diff: Path) -> Iterator[bytes]:
    for line in records:
        entry = json.loads(line)
        kind = entry["type"]
        if kind == _SEGMENT:
            if entry.get("payload"):
                yield base64.b64decode(entry["payload"])
        elif kind == _FILE:
            if entry.get("size"):
                yield from _file_content(diff, _entry_path(entry), entry["size"])
        else:
            raise UnreadableLayer(f"unknown tar-split entry type {kind!r}")


def _entry_path(entry: dict) -> str:
    name = base64.b64decode(entry["name_raw"]).decode("utf-8", "surrogateescape") if entry.get("name_raw") \
        else entry["name"]
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise UnreadableLayer(f"tar-split names a file outside the layer: {name!r}")
    return "/".join(part for part in parts if part not in ("/", "."))


def _file_content(diff: Path, relative: str, size: int) -> Iterator[bytes]:
    remaining = size
    try:
        with open(diff / relative, "rb") as content:
            while remaining:
                chunk = content.read(min(_CHUNK, remaining))
                if not chunk:
                    raise UnreadableLayer(f"{relative} in {diff} is shorter than its tar entry")
                remaining -= len(chunk)
                yield chunk
    except OSError as error:
        raise UnreadableLayer(f"{relative} in {diff}: {error.strerror}") from None


class OverlayStorage:
    """The layers of one overlay storage (its graph root), found by diff_id."""

    def __init__(self, graph_root: Path) -> None:
        self.graph_root = Path(graph_root)

    @classmethod
    def of(cls, buildah: Sequence[str]) -> OverlayStorage | None:
        """The storage `buildah` (the command and its global options) uses, when it is an overlay storage
        this process can read; else None."""
        result = subprocess.run([*buildah, "info", "--format", "{{.store.GraphRoot}} {{.store.GraphDriverName}}"],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL, errors="replace")
        root, _, driver = result.stdout.strip().rpartition(" ")
        if result.returncode != 0 or driver != "overlay" or not (Path(root) / "overlay-layers").is_dir():
            return None
        return cls(Path(root))

    def open(self, diff_id: str) -> LayerStream | None:
        """The tar of a stored layer whose diff_id is `diff_id`; None when no such layer has its record
        and directory here."""
        try:
            layers = json.loads((self.graph_root / "overlay-layers" / "layers.json").read_text())
        except (OSError, ValueError):
            return None
        for layer in layers:
            if layer.get("diff-digest") != diff_id:
                continue
            tar_split = self.graph_root / "overlay-layers" / f"{layer['id']}.tar-split.gz"
            diff = self.graph_root / "overlay" / layer["id"] / "diff"
            if tar_split.is_file() and diff.is_dir():
                return LayerStream(tar_split, diff)
        return None
