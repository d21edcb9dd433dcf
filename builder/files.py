"""Writing files so that a reader or a crash never sees a torn one; placing cached files cheaply;
removing a scratch tree that a killed run left mounts in."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

TEMP_SUFFIX = ".tmp"
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace `path` with `text` (or bytes) so a reader sees the old file or the new one, never a torn one."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(descriptor, _mode_for(path))  # mkstemp makes 0600; keep the file's own mode
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (wheels and image layers run to gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` (no gigabytes copied); a copy only across filesystems."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)


class HashingWriter:
    """A write-only stream that hashes and counts what passes through to `sink`: a blob's digest and size
    are known the moment its last byte is written, with no second read."""

    def __init__(self, sink: IO[bytes]) -> None:
        self._sink, self._hash, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.size += len(data)
        return self._sink.write(data)

    def tell(self) -> int:
        return self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


def mounts_below(directory: Path) -> list[Path]:
    """The mount points at or under `directory` (the kernel's /proc/self/mountinfo), deepest first."""
    directory = Path(os.path.realpath(directory))
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            # Field 5 is the mount point, with space, tab, newline and backslash written as octal escapes.
            point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split(" ")[4]))
            if point == directory or directory in point.parents:
                found.append(point)
    return sorted(found, key=lambda point: len(point.parts), reverse=True)


def remove_scratch(directory: Path) -> None:
    """Remove a scratch tree of the builder's own as far as it can, first detaching what is mounted in
    it (a killed run's overlays, a stack's layers): rmtree cannot remove a mount point. umount2(2)
    with MNT_DETACH, as `umount --lazy`, without a process per mount."""
    for point in mounts_below(directory):
        detach(point)
    shutil.rmtree(directory, ignore_errors=True)


def detach(point: Path) -> bool:
    """umount2(2) with MNT_DETACH: the mount leaves the table at once, and goes when no one uses it."""
    return _libc.umount2(os.fsencode(point), _MNT_DETACH) == 0


@contextlib.contextmanager
def locked(path: Path, operation: int = fcntl.LOCK_EX) -> Iterator[IO[str]]:
    """`path` (made if missing) held with flock(2) `operation` for the block: the kernel frees it when
    the holder dies, so a lock never outlives a killed process. LOCK_NB in `operation` raises
    BlockingIOError where another holds it."""
    with Path(path).open("a") as handle:
        fcntl.flock(handle, operation)
        yield handle
