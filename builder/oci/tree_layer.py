"""What one build step changed in the root it ran on, written as one canonical layer.

The write-once builder (builder/engine/write_once.py) runs the steps on a root that overlayfs stacks
from the image's layers under an upper directory of the builder's own (engine/overlay_mount.py). All a
step changes lands in that upper directory, so only it is read, never the image's whole tree. The
upper directory gathers every step since the stack was made, and a step's layer is what the engine's
own fresh upper layer for that step would hold, in canonical.py's form:
  - every entry whose inode changed during the step: the kernel sets ctime on any write, chmod, chown,
    rename or link, and on the copy-up of a lower file, so "ctime at or after the step's mark" is
    exactly what an overlay upper layer would hold; the mark is a file made just before the step,
    so it carries the kernel's own (coarse) clock;
  - every directory above such an entry (an engine's fresh upper layer copies each one up);
  - a whiteout (".wh.NAME", mode 0) for each path that was there before the step and is gone: where
    overlayfs put its own whiteout during the step, or where an entry of an earlier step vanished;
  - an opaque marker for a directory removed and made again: one overlayfs marked opaque during the
    step, or one of an earlier step that has another inode (or, its number reused, was born again);
  - with every time set to SOURCE_DATE_EPOCH (as `buildah build --timestamp` does), permission bits
    only, numeric owners, extended attributes as SCHILY.xattr.*, a second name of an inode as a hard
    link, and the engine's empty mount-point stubs (canonical.ENGINE_STUBS) left out of RUN steps.
Entries are in canonical.written_order: a directory right before what it holds.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.oci import canonical, layer_listing
from builder.oci.layout import Layout

_CHUNK = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW, _STATX_BTIME = -100, 0x100, 0x800
_STATX_SIZE, _STATX_BTIME_OFFSET = 256, 80  # struct statx (linux/stat.h): stx_btime after stx_atime
_WHITEOUT = ".wh."
# The overlay's own bookkeeping; never part of an image.
_HIDDEN_XATTR = ("trusted.overlay.", "security.selinux")
_OPAQUE_XATTR = "trusted.overlay.opaque"


@dataclass(frozen=True)
class Snapshot:
    """The upper directory after a step: every path in it (relative, "/"-separated) but overlayfs's
    whiteouts, each directory's inode and birth time, the whiteouts, and the directories overlayfs
    marked opaque: what a later deletion, and a directory removed and made again, are told from."""

    paths: frozenset[str]
    directories: dict[str, tuple[int, int | None]]  # inode number, birth time
    whiteouts: frozenset[str]
    opaque: frozenset[str]


def _snapshot_of(upper: Path, stats: dict[str, os.stat_result], whiteouts: set[str]) -> Snapshot:
    directories = {path: info for path, info in stats.items() if stat.S_ISDIR(info.st_mode)}
    return Snapshot(frozenset(stats), {path: (info.st_ino, _birth(upper / path)) for path, info in directories.items()},
                    frozenset(whiteouts), frozenset(path for path in directories if _marked_opaque(upper / path)))


@dataclass(frozen=True)
class WrittenLayer:
    diff_id: str
    size: int
    listing: tuple[layer_listing.Row, ...]  # what the tar holds, in its order, for the smoke gate's view

    @property
    def entries(self) -> int:
        return len(self.listing)


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below `root` with its lstat, never following a symbolic link."""
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(root / relative if relative else root) as entries:
            for entry in entries:
                path = f"{relative}/{entry.name}" if relative else entry.name
                info = entry.stat(follow_symlinks=False)
                yield path, info
                if stat.S_ISDIR(info.st_mode):
                    pending.append(path)


def _walk_under(root: Path, top: str) -> Iterator[tuple[str, os.stat_result]]:
    """`top`'s parents, `top` and everything below it, with their lstat (nothing where `top` is missing)."""
    try:
        info = os.lstat(root / top)
    except FileNotFoundError:
        return
    for parent in _parents(top):
        yield parent, os.lstat(root / parent)
    yield top, info
    if stat.S_ISDIR(info.st_mode):
        for path, below in walk(root / top):
            yield f"{top}/{path}", below


def _plain_path(root: Path, path: str) -> bool:
    """Whether no part of `path` under `root` is a symbolic link."""
    for part in [*_parents(path), path]:
        try:
            if stat.S_ISLNK(os.lstat(root / part).st_mode):
                return False
        except FileNotFoundError:
            return True
    return True


def snapshot(upper: Path) -> Snapshot:
    stats: dict[str, os.stat_result] = {}
    whiteouts: set[str] = set()
    for path, info in walk(upper):
        if _is_whiteout(info):
            whiteouts.add(path)
        elif not _is_stub(path, info):
            stats[path] = info
    return _snapshot_of(upper, stats, whiteouts)


def mark(scratch: Path) -> int:
    """The kernel's clock now, as a ctime (a file's, so in the clock's own coarse ticks), with a pause
    on each side: nothing the previous step wrote shares it, and nothing the next step writes is older."""
    time.sleep(0.02)
    marker = scratch / f".builder-mark-{os.getpid()}-{threading.get_native_id()}"  # two steps may run at once
    marker.write_bytes(b"")
    try:
        return marker.stat().st_ctime_ns
    finally:
        marker.unlink()
        time.sleep(0.02)


def _birth(path: Path) -> int | None:
    """The birth time of the inode at `path` (statx), where the filesystem keeps one."""
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    if _libc.statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buffer) != 0:
        return None
    if not struct.unpack_from("I", buffer, 0)[0] & _STATX_BTIME:
        return None
    seconds, nanoseconds = struct.unpack_from("qI", buffer, _STATX_BTIME_OFFSET)
    return seconds * 1_000_000_000 + nanoseconds


def _made_again(before: tuple[int, int | None], now: tuple[int, int | None], since_ns: int,
                build_started_ns: int) -> bool:
    """Whether a directory was removed and made again during the step (the engine writes it opaque).
    A new inode number says so. The same number says so too when the directory was made by this build
    (its inode may be reused) and is born again; a directory of the base born again was copied up."""
    (old_inode, old_birth), (new_inode, new_birth) = before, now
    if old_inode != new_inode:
        return True
    return (old_birth is not None and new_birth is not None and old_birth >= build_started_ns
            and new_birth >= since_ns)


def _parents(path: str) -> Iterator[str]:
    parts = path.split("/")
    return ("/".join(parts[:depth]) for depth in range(1, len(parts)))


def _lower_directory(lowers: Path, path: str, before: Snapshot) -> bool:
    """Whether the root held a directory at `path` from the stack's layers when the step began: overlayfs
    also marks opaque every directory made new in a directory the layers hold (it spares itself the
    lookups below), so its mark alone does not say that one was removed. An earlier step's whiteout, or
    a directory it made or made again, hides what the layers hold below."""
    if path in before.paths or path in before.whiteouts:
        return False
    if any(parent in before.whiteouts or parent in before.opaque for parent in _parents(path)):
        return False
    try:
        return stat.S_ISDIR(os.lstat(lowers / path).st_mode)
    except OSError:
        return False


def _is_whiteout(info: os.stat_result) -> bool:
    """overlayfs's whiteout in an upper directory: a character device 0:0."""
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _marked_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _is_stub(path: str, info: os.stat_result) -> bool:
    return path in canonical.ENGINE_STUBS and stat.S_ISREG(info.st_mode) and info.st_size == 0


def _xattrs(path: Path) -> dict[str, str]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    values = {}
    for name in sorted(names):
        if name.startswith(_HIDDEN_XATTR):
            continue
        value = os.getxattr(path, name, follow_symlinks=False)
        values["SCHILY.xattr." + name] = value.decode("utf-8", "surrogateescape")
    return values


def _header(root: Path, path: str, info: os.stat_result, epoch: int, link_to: str | None) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(path)
    mode = info.st_mode
    if link_to is not None:
        entry.type, entry.linkname = tarfile.LNKTYPE, link_to
    elif stat.S_ISREG(mode):
        entry.type, entry.size = tarfile.REGTYPE, info.st_size
    elif stat.S_ISDIR(mode):
        entry.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(mode):
        entry.type, entry.linkname = tarfile.SYMTYPE, os.readlink(root / path)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        entry.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        entry.devmajor, entry.devminor = os.major(info.st_rdev), os.minor(info.st_rdev)
    elif stat.S_ISFIFO(mode):
        entry.type = tarfile.FIFOTYPE
    else:
        raise OSError(f"{path}: a socket cannot be stored in a layer")
    entry.mode, entry.uid, entry.gid, entry.mtime = mode & 0o7777, info.st_uid, info.st_gid, epoch
    entry.pax_headers = _xattrs(root / path)
    return canonical.canonical_entry(entry)


def write_step_layer(layout: Layout, root: Path, upper: Path, since_ns: int, before: Snapshot, epoch: int,
                     drop_stubs: bool, build_started_ns: int = 0, under: str | None = None,
                     lowers: Path | None = None) -> tuple[WrittenLayer, Snapshot]:
    """The layer of what changed since the mark `since_ns` on the stacked root `root`, read from its
    upper directory `upper`, stored in `layout`; and the upper directory's snapshot now. `before` is
    its snapshot when the step began; `build_started_ns` the mark taken before the stack was made;
    `lowers` the root as the stack's layers alone give it (None: no layers below `upper`). `under` (a
    relative path): the step wrote nothing outside it (a COPY's destination), so only it and its
    parents are read."""
    if under is not None and not _plain_path(root, under):
        under = None  # a link on the way: where the step wrote is not where the path points on the host
    stats: dict[str, os.stat_result] = {}
    changed: set[str] = set()
    whiteouts: set[str] = set()
    new_whiteouts: set[str] = set()
    for path, info in (walk(upper) if under is None else _walk_under(upper, under)):
        if _is_whiteout(info):
            # All of a stack's whiteouts are links of one inode (its ctime moves with each new one):
            # a new whiteout is one the upper directory did not hold.
            whiteouts.add(path)
            if path not in before.whiteouts:
                new_whiteouts.add(path)
            continue
        if _is_stub(path, info):
            # The engine's mount point, made by the first RUN and kept: in no snapshot, so never
            # whited out; in a layer only where a COPY wrote it.
            if not drop_stubs and info.st_ctime_ns >= since_ns:
                stats[path] = info
                changed.add(path)
            continue
        stats[path] = info
        if info.st_ctime_ns >= since_ns or path not in before.paths:
            changed.add(path)
    now = _snapshot_of(upper, {path: info for path, info in stats.items() if not _is_stub(path, info)}, whiteouts)
    if under is not None:  # what was not read is as it was
        def outside(paths):
            return {path for path in paths if path != under and not path.startswith(under + "/")}
        kept = outside(before.paths)
        now = Snapshot(now.paths | kept,
                       {**{path: inode for path, inode in before.directories.items() if path in kept},
                        **now.directories},
                       now.whiteouts | outside(before.whiteouts), now.opaque | outside(before.opaque))
    # A directory removed and made again during the step is opaque: nothing below it comes from the
    # layers under it, so its old contents need no whiteouts. One the layers below held, overlayfs
    # marked opaque when it was made again over its whiteout; one an earlier step made has another
    # inode now (or was born again).
    opaque = {path for path in now.directories if path in changed and (
        (path in before.directories
         and _made_again(before.directories[path], now.directories[path], since_ns, build_started_ns))
        or (path in now.opaque and lowers is not None and _lower_directory(lowers, path, before)))}
    # Below a directory made again every directory is new: only the top one is marked.
    opaque = {path for path in opaque if not any(parent in opaque for parent in _parents(path))}
    removed = (before.paths - now.paths) | new_whiteouts
    # A deleted path below another deleted one is covered by its parent's whiteout.
    gone = {path for path in removed
            if not any(parent in removed or parent in opaque for parent in _parents(path))}
    wanted: set[str] = set()
    for path in changed | gone:
        parts = path.split("/")
        wanted.update("/".join(parts[:depth]) for depth in range(1, len(parts)))
    wanted |= changed
    order = sorted(wanted | gone, key=canonical.written_order)
    first_name: dict[tuple[int, int], str] = {}
    first_whiteout: str | None = None
    with layout.blob_writer() as blob, tarfile.TarFile(fileobj=blob, mode="w", format=tarfile.PAX_FORMAT,
                                                        encoding="utf-8", errors="surrogateescape",
                                                        copybufsize=_CHUNK) as tar:
        for path in order:
            if path in gone:
                parent, _, name = path.rpartition("/")
                whiteout = tarfile.TarInfo(f"{parent}/{_WHITEOUT}{name}" if parent else _WHITEOUT + name)
                whiteout.mode, whiteout.mtime = 0, epoch
                # As the engine's tar has them: overlayfs makes every whiteout of a layer a link of one
                # inode, so each after the first names the first one's path as its link.
                whiteout.linkname = first_whiteout or ""
                first_whiteout = first_whiteout or path
                tar.addfile(canonical.canonical_entry(whiteout))
                continue
            info = stats[path]
            link_to = None
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                link_to = first_name.setdefault((info.st_dev, info.st_ino), path)
                link_to = None if link_to == path else link_to
            header = _header(upper, path, info, epoch, link_to)
            if header.type == tarfile.REGTYPE:
                fd = os.open(upper / path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as handle:
                    tar.addfile(header, handle)
            else:
                tar.addfile(header)
            if path in opaque:
                marker = tarfile.TarInfo(f"{path}/{_WHITEOUT}{_WHITEOUT}.opq")
                marker.mode, marker.mtime = info.st_mode & 0o777, epoch
                marker.uid, marker.gid = info.st_uid, info.st_gid
                tar.addfile(canonical.canonical_entry(marker))
        rows = layer_listing.rows_of(tar.members)
    return WrittenLayer(blob.digest, blob.size, tuple(rows)), now
