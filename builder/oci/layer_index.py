"""Each image layer made mountable once, without a second copy of its files: a metadata-only EROFS image
(`mkfs.erofs --tar=i --aufs`, erofs-utils 1.7 or later; scripts/erofs-utils) whose file data stays in the
layer's tar blob in the layout. Mounted with that blob as its data device (engine/overlay_mount.py), it
is the lower directory overlayfs expects: the tar's files, directories, symbolic and hard links,
permission bits (setuid, setgid and sticky too), numeric owners, mtimes and extended attributes; a
whiteout `DIR/.wh.NAME` is the character device 0:0 `DIR/NAME`, and `DIR/.wh..wh..opq` the xattr
`trusted.overlay.opaque=y` on DIR. The index of a layer of 30,000 files is a few MB: the image's bytes
are on disk once, in the blobs (docs/write-once.md).

A layer that sets overlayfs's own attributes (trusted.overlay.*) itself is refused: they would steer the
stack (hide a lower directory, redirect a path) where only the layer's whiteouts may. GNU tar lists the
headers for that check (it seeks over the data), and says whether the layer lists its root directory:
a tar without a `./` entry gets a root of mode 0777 in the index, which is not the layer's
(overlay_mount takes the image's root from the topmost layer that lists one).

An index is written under a temporary name, synced and renamed into place, so a killed indexing leaves
only the temporary. Indexings hold a shared lock on `root/.lock` (their mkfs.erofs inherits it, and
outlives a killed parent), and `sweep` removes temporaries only while it holds that lock exclusively:
never live work. An index is never changed after its rename; one serves every image holding its layer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure, UserError, one_line
from builder.files import TEMP_SUFFIX, locked
from builder.oci.layout import Layout, LayoutError, hex_of

_LOCK = ".lock"
_MKFS = "mkfs.erofs"
# Meta-only (the data stays in the tar), OCI whiteouts as overlayfs's.
_INDEX = [_MKFS, "--quiet", "--tar=i", "--aufs"]
# The headers alone, with overlayfs's attributes where an entry sets them: a line "  x: ..." each.
_LIST = ["tar", "--list", "-vv", "--numeric-owner", "--quoting-style=escape", "--xattrs",
         "--xattrs-include=trusted.overlay.*"]
_XATTR_LINE = b"  x: "
# An entry's line: mode string, owner/group, size (or major,minor), date, time, then the name.
_ENTRY = re.compile(rb"^(\S)\S* +\S+ +\S+ +\S+ +\S+ (.*)$")
_ROOT_NAMES = {b".", b"./", b"/"}
_MKFS_TAG = re.compile(r"^<[A-Z]> erofs:\s*")
# The name an index of a layer listing its root carries: the fact travels with the file it is about.
_LISTED_ROOT = ".root"
_SUFFIX = ".erofs"


@dataclass(frozen=True)
class LayerIndex:
    """A layer as overlay_mount mounts it: `index` (EROFS metadata) over `blob` (its tar, the data)."""

    diff_id: str
    index: Path
    blob: Path
    lists_root: bool  # whether the tar has a `./` entry (else the mounted root's attributes are not its)


class LayerIndexes:
    """The layers' indexes under `root`, each `root/<hex of its diff_id>[.root].erofs`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def index(self, layout: Layout, diff_id: str) -> LayerIndex:
        """Layer `diff_id` of `layout` (an uncompressed tar blob) as it mounts, indexed now unless an
        earlier call did."""
        blob = layout.blob_path(diff_id)
        found = self._found(diff_id, blob)
        if found is not None:
            return found
        if not blob.is_file():
            raise LayoutError(f"{layout.root}: no blob {diff_id}")
        _require_mkfs()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._lock(fcntl.LOCK_SH) as lock:
            lists_root = _checked_headers(blob, diff_id)
            final = self._path(diff_id, lists_root)
            descriptor, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=self.root)
            temporary = Path(name)
            try:
                os.close(descriptor)
                _make_index(blob, temporary, diff_id, lock)
                _publish(temporary, final)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        return LayerIndex(diff_id, final, blob, lists_root)

    def sweep(self) -> list[str]:
        """Remove the temporaries killed indexings left; their names. Nothing while an indexing runs
        (its temporary cannot be told from a dead one's): those wait for the next sweep."""
        if not self.root.is_dir():
            return []
        try:
            with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
                left = sorted(self.root.glob(f".*{TEMP_SUFFIX}"))
                for path in left:
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        except BlockingIOError:
            return []
        return [path.name for path in left]

    def _path(self, diff_id: str, lists_root: bool) -> Path:
        return self.root / f"{hex_of(diff_id)}{_LISTED_ROOT if lists_root else ''}{_SUFFIX}"

    def _found(self, diff_id: str, blob: Path) -> LayerIndex | None:
        for lists_root in (False, True):
            path = self._path(diff_id, lists_root)
            if path.is_file():
                return LayerIndex(diff_id, path, blob, lists_root)
        return None

    def _lock(self, operation: int) -> contextlib.AbstractContextManager[IO[str]]:
        return locked(self.root / _LOCK, operation)


def _require_mkfs() -> None:
    if shutil.which(_MKFS) is None:
        raise UserError(f"{_MKFS} (erofs-utils 1.7 or later) is not on PATH: scripts/erofs-utils builds it")


def _checked_headers(blob: Path, diff_id: str) -> bool:
    """Whether the layer lists its root; refused where an entry sets overlayfs's own attributes."""
    listing = subprocess.run([*_LIST, "--file", str(blob)], stdin=subprocess.DEVNULL, capture_output=True,
                             env={**os.environ, "LC_ALL": "C"}, check=False)
    if listing.returncode != 0:
        raise BuildFailure(f"layer {diff_id} does not read as a tar archive: {_complaint(listing.stderr)}")
    lists_root = False
    for line in listing.stdout.split(b"\n"):
        if line.startswith(_XATTR_LINE):
            raise BuildFailure(f"layer {diff_id} sets overlayfs's own attribute "
                               f"{one_line(line[len(_XATTR_LINE):].decode(errors='replace'))}: refused (only "
                               "its whiteouts may hide or redirect what the layers below hold)")
        entry = _ENTRY.match(line)
        if entry is not None and entry[1] == b"d" and entry[2] in _ROOT_NAMES:
            lists_root = True
    return lists_root


def _make_index(blob: Path, target: Path, diff_id: str, lock: IO[str]) -> None:
    made = subprocess.run([*_INDEX, str(target), str(blob)], stdin=subprocess.DEVNULL, capture_output=True,
                          pass_fds=(lock.fileno(),), check=False)
    if made.returncode != 0:
        raise BuildFailure(f"layer {diff_id}: {_MKFS} could not index it: {_complaint(made.stderr)}")
    with target.open("rb") as written:
        os.fsync(written.fileno())


def _complaint(stderr: bytes) -> str:
    """What the tool said went wrong, without tar's harmless warnings and closing line, or mkfs.erofs's
    level tag."""
    lines = [_MKFS_TAG.sub("", line) for line in stderr.decode(errors="replace").splitlines()
             if line.strip() and "Removing leading" not in line and "Exiting with failure" not in line]
    return one_line(lines[0] if lines else "no reason given")


def _publish(temporary: Path, final: Path) -> None:
    """`temporary` renamed to `final` (an earlier index of the same layer is the same file)."""
    os.rename(temporary, final)
    handle = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
