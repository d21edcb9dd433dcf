"""Whether a file in a content-keyed cache still is the content its key names.

A file's presence proves nothing: it may have been planted, damaged or truncated after it was stored.
So a cached file is hashed again before use, and the result is recorded beside it (`<file>.checked`:
its sha256 with the inode, size and modification time it was hashed at), written atomically. The
next use rehashes only when the file is no longer that inode, size and time. A file that does not
hash to its key is removed (with its record) and fetched again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from builder.files import sha256_file, write_atomic

SUFFIX = ".checked"


def _stamp(path: Path, sha256: str) -> dict:
    status = os.stat(path)
    return {"sha256": sha256, "inode": status.st_ino, "size": status.st_size, "mtime_ns": status.st_mtime_ns}


def _record(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def record_checked(path: Path, sha256: str) -> None:
    """`path` was just hashed to `sha256` (a fresh download): record it."""
    write_atomic(_record(path), json.dumps(_stamp(path, sha256), sort_keys=True))


def holds(path: Path, sha256: str, size: int | None = None) -> bool:
    """True when `path` is a file whose content has `sha256` (and `size`, when given); a file that is
    not is removed with its record, and one line says so."""
    if not path.is_file():
        return False
    try:
        if json.loads(_record(path).read_text(encoding="utf-8")) == _stamp(path, sha256):
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path) == sha256 and (size is None or path.stat().st_size == size):
        record_checked(path, sha256)
        return True
    for stale in (path, _record(path)):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    print(f"builder: cache: {path.name} did not hash to its sha256 {sha256[:16]}...; removed, it is fetched again",
          file=sys.stderr)
    return False


def first_pins(pins: list[str], most: int = 8) -> str:
    """The first `most` of what a cache lacks, for a one-line error: "a, b, c, ..."."""
    return ", ".join(pins[:most]) + (", ..." if len(pins) > most else "")
