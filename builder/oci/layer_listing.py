"""A layer tar's listing: each entry's absolute path, kind and link target, in the tar's order, kept by
diff_id under a listings directory so a layer's tar is read for it at most once. The write-once build
keeps the listing of each layer it writes as it writes it; a reader (the smoke gate's view of an image,
smoke/image_files.py) reads a tar only for a layer nobody listed.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Iterable
from pathlib import Path

from builder.files import write_atomic
from builder.oci.layout import hex_of

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


def _kept(listings_dir: Path, diff_id: str) -> Path:
    return listings_dir / f"{hex_of(diff_id)}.json"


def keep(listings_dir: Path, diff_id: str, rows: list[Row]) -> None:
    listings_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(_kept(listings_dir, diff_id), json.dumps(rows))


def listing(tar_path: Path, diff_id: str, listings_dir: Path) -> list[Row]:
    """The layer's rows: kept ones when there are, else read from its tar (uncompressed: each member's
    data is skipped by a seek) and kept."""
    try:
        return [tuple(row) for row in json.loads(_kept(listings_dir, diff_id).read_text())]
    except (OSError, ValueError):
        pass
    with tarfile.open(tar_path, "r:") as tar:
        rows = rows_of(tar)
    keep(listings_dir, diff_id, rows)
    return rows
