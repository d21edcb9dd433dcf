"""A layer tar's listing: each entry's absolute path, kind and link target, in the tar's order, kept by
diff_id under a listings directory so a layer's tar is read for it at most once. The write-once build
keeps the listing of each layer it writes as it writes it; a reader (the smoke gate's view of an image,
smoke/image_files.py) reads a tar only for a layer nobody listed. A small layer's regular files are
also digested on demand (file_digests), and kept the same way.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from collections.abc import Iterable
from pathlib import Path

from builder.files import write_atomic
from builder.oci.layout import hex_of

# A layer at most this big is read for its files' digests (file_digests): the in-image tools, the
# patches, the small configs. Reading a wheel group's gigabytes would cost more than it could spare.
DIGESTED_LAYER_LIMIT = 64 << 20

Row = tuple[str, str, str]  # (absolute path, "dir" | "file" | "link" | "hardlink" | "other", target)


def rows_of(members: Iterable[tarfile.TarInfo]) -> list[Row]:
    rows = []
    for member in members:
        kind = ("dir" if member.isdir() else "link" if member.issym() else "hardlink" if member.islnk()
                else "file" if member.isfile() else "other")
        target = member.linkname if kind == "link" else absolute(member.linkname) if kind == "hardlink" else ""
        rows.append((absolute(member.name), kind, target))
    return rows


def absolute(name: str) -> str:
    """A tar member's name as the absolute path it has in the image."""
    return posixpath.normpath("/" + name.removeprefix("./").rstrip("/"))


def _kept(listings_dir: Path, diff_id: str, suffix: str = ".json") -> Path:
    return listings_dir / f"{hex_of(diff_id)}{suffix}"


def _read_kept(path: Path) -> object | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_kept(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(value, sort_keys=True))


def keep(listings_dir: Path, diff_id: str, rows: list[Row]) -> None:
    _write_kept(_kept(listings_dir, diff_id), rows)


def listing(tar_path: Path, diff_id: str, listings_dir: Path) -> list[Row]:
    """The layer's rows: kept ones when there are, else read from its tar (uncompressed: each member's
    data is skipped by a seek) and kept."""
    kept = _read_kept(_kept(listings_dir, diff_id))
    if kept is not None:
        return [tuple(row) for row in kept]
    with tarfile.open(tar_path, "r:") as tar:
        rows = rows_of(tar)
    keep(listings_dir, diff_id, rows)
    return rows


def file_digests(tar_path: Path, diff_id: str, listings_dir: Path) -> dict[str, str] | None:
    """{absolute path: digest of its mode, owner, time, size and bytes} for each regular file of a layer
    of at most DIGESTED_LAYER_LIMIT bytes, kept beside its listing; None for a bigger layer, or one whose
    tar is gone and whose digests nobody kept."""
    kept_path = _kept(listings_dir, diff_id, ".files.json")
    kept = _read_kept(kept_path)
    if kept is not None:
        return kept
    try:
        if tar_path.stat().st_size > DIGESTED_LAYER_LIMIT:
            return None
    except OSError:
        return None
    digests = {}
    with tarfile.open(tar_path, "r:") as tar:
        for member in (member for member in tar if member.isfile()):
            header = f"{member.mode:o} {member.uid}:{member.gid} {member.mtime} {member.size}\n"
            digest = hashlib.sha256(header.encode())
            with tar.extractfile(member) as data:
                for chunk in iter(lambda: data.read(1 << 20), b""):
                    digest.update(chunk)
            digests[absolute(member.name)] = f"sha256:{digest.hexdigest()}"
    _write_kept(kept_path, digests)
    return digests
