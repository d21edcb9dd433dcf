"""Where the engine stages an image's blobs on import: in memory when there is room, else on disk.

`buildah pull` (containers/image) writes every blob it imports to a temporary file under $TMPDIR
first, then applies it to its storage: each layer is written twice, and the staged copies are
deleted when the pull ends. A directory on the memory filesystem (/dev/shm) takes that first write
off the disk. It is used only when the memory filesystem has room for all of the import's new layers
and the machine's available memory keeps RESERVE_BYTES beyond them; otherwise the engine stages
where it always does. A build that dies leaves its directory, named by its pid, for the next build's
sweep (`sweep`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from builder.engine.ownership import process_alive

MEMORY_FS = Path("/dev/shm")
# What the rest of the build (and the machine) keeps, at the least, beside the staged layers.
RESERVE_BYTES = 4 << 30
_PREFIX = "builder-staging-"


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable in bytes (0 when the kernel does not say)."""
    with contextlib.suppress(OSError):
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable" and value.split()[-1:] == ["kB"]:
                return int(value.split()[0]) * 1024
    return 0


def fits_in_memory(need_bytes: int, memory_fs: Path | None = None, meminfo: Path = Path("/proc/meminfo")) -> bool:
    try:
        stats = os.statvfs(memory_fs or MEMORY_FS)
    except OSError:
        return False
    return (stats.f_bavail * stats.f_frsize >= need_bytes
            and available_memory(meminfo) >= need_bytes + RESERVE_BYTES)


@contextlib.contextmanager
def staging_environment(need_bytes: int, memory_fs: Path | None = None) -> Iterator[dict[str, str]]:
    """The environment for an import of `need_bytes` of new layers: TMPDIR in a fresh directory on the
    memory filesystem when they fit (removed afterwards), else the caller's own environment."""
    memory_fs = memory_fs or MEMORY_FS
    if not fits_in_memory(need_bytes, memory_fs):
        yield dict(os.environ)
        return
    directory = memory_fs / f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    directory.mkdir(mode=0o700)
    try:
        yield {**os.environ, "TMPDIR": str(directory)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def sweep(memory_fs: Path | None = None) -> list[str]:
    """Staging directories whose build is gone, removed; returns their names."""
    memory_fs, swept = memory_fs or MEMORY_FS, []
    for path in memory_fs.glob(f"{_PREFIX}*") if memory_fs.is_dir() else ():
        pid = path.name[len(_PREFIX):].split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path.name)
    return swept
