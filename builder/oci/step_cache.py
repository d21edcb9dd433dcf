"""The write-once build's layer cache: each step's layer, keyed by the step and everything it reads.

A step's key chains the key of the step before it (from the base image id and the build's epoch up),
its history text (the instruction as written, with its build arguments), and the content of what it
reads from the context: COPY's sources and RUN's bind-mount sources, as a digest of each file tree
(relative path, type, permission bits, content or link target; owners are not copied). So a layer is
reused exactly when the engine's own cache would reuse it, and a change reaches every step after it.

Hashing the context's wheels (gigabytes) on every no-op rebuild would cost more than the rest, so a
file's content digest is memoised under its identity on disk (device, inode, size, mtime): the
context's wheels are hard links into the content-keyed wheel cache, so they keep that identity from
build to build. A memo that names a missing or changed file is never consulted: the identity is read
fresh each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from builder.files import sha256_file, write_atomic

# Bumped when what a key covers, or how a layer is written, changes: old entries then miss.
KEY_FORMAT = "write-once-step-2"


class DigestMemo:
    """Content digests of files, under their on-disk identity; saved with save()."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._known: dict[str, str] = {}
        self._changed = False
        try:
            loaded = json.loads(self.path.read_text())
            self._known = {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self._known = {}

    def file_digest(self, path: Path, info: os.stat_result) -> str:
        identity = f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
        known = self._known.get(identity)
        if known is None:
            known = self._known[identity] = sha256_file(path)
            self._changed = True
        return known

    def save(self) -> None:
        if self._changed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self._known, sort_keys=True) + "\n")
            self._changed = False


def tree_digest(path: Path, memo: DigestMemo) -> str:
    """The digest of a file or directory tree as COPY or a read-only mount gives it to a step."""
    digest = hashlib.sha256()
    root = Path(path)
    for relative, info in _entries(root):
        digest.update(f"{relative}\0{stat.S_IFMT(info.st_mode):o}\0{stat.S_IMODE(info.st_mode):o}\0".encode())
        full = root / relative if relative != "." else root
        if stat.S_ISREG(info.st_mode):
            digest.update(memo.file_digest(full, info).encode())
        elif stat.S_ISLNK(info.st_mode):
            digest.update(os.readlink(full).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _entries(root: Path) -> Iterable[tuple[str, os.stat_result]]:
    top = os.lstat(root)
    yield ".", top
    if not stat.S_ISDIR(top.st_mode):
        return
    for directory, names, files in os.walk(root):
        names.sort()
        for name in sorted(names + files):
            full = Path(directory) / name
            yield str(full.relative_to(root)), os.lstat(full)


def chain(previous: str, *parts: str) -> str:
    digest = hashlib.sha256(previous.encode())
    for part in parts:
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def first_key(base_image_id: str, epoch: int) -> str:
    return chain(KEY_FORMAT, base_image_id, str(epoch))


@dataclass(frozen=True)
class CachedLayer:
    diff_id: str
    size: int


class StepCache:
    """key -> the layer a step wrote: one small file per key under `root`, written atomically after the
    layer's blob is in place, so an entry never names a blob that was not fully written."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _file(self, key: str) -> Path:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a step key: {key!r}")
        return self.root / KEY_FORMAT / key

    def get(self, key: str) -> CachedLayer | None:
        path = self._file(key)
        try:
            data = json.loads(path.read_text())
            return CachedLayer(str(data["diff_id"]), int(data["size"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record(self, key: str, layer: CachedLayer) -> None:
        path = self._file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"diff_id": layer.diff_id, "size": layer.size}) + "\n")
