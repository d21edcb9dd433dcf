"""Each image layer extracted once into a directory kept by its diff_id: a lower directory for overlayfs
(engine/overlay_mount.py), so a container step runs on the image's own layers instead of an import into
the engine's storage (docs/write-once.md, "What remains for issue 31").

A tree is what overlayfs expects of a lower layer: the tar's files, directories, symbolic and hard links,
permission bits (setuid, setgid and sticky too), numeric owners, mtimes and extended attributes; a
whiteout `DIR/.wh.NAME` becomes the character device 0:0 `DIR/NAME`, and `DIR/.wh..wh..opq` the xattr
`trusted.overlay.opaque=y` on DIR. GNU tar extracts everything but the whiteouts (several times faster
than tarfile) while a second GNU tar lists the names from the headers alone (it seeks over the data);
the whiteouts and opaque markers among them are made once the extraction is done.

A tree is extracted into a temporary sibling and renamed into place whole, so a killed
extraction leaves only the temporary; when two extract one layer at once, the later rename fails and its
copy goes. Extractions hold a shared lock on `root/.lock` (their tar inherits it, and outlives a killed
parent), and `sweep` removes temporaries only while it holds that lock exclusively: never live work.

One tree serves every image that holds its layer, and overlayfs never writes a lower directory: nothing
may change a tree after its rename. `root` is private (0700) because trees hold the images' setuid files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from builder.errors import BuildFailure, one_line
from builder.files import TEMP_SUFFIX, locked
from builder.oci.layout import Layout, LayoutError, hex_of

_WHITEOUT = ".wh."
_WHITEOUT_BYTES = _WHITEOUT.encode()
_OPAQUE = ".wh..wh..opq"
_AUFS_META = ".wh..wh."  # aufs's own bookkeeping (.wh..wh.plnk and the like), never a file of the image
_OPAQUE_XATTR = "trusted.overlay.opaque"
_LOCK = ".lock"
_EXTRACT = [
    "tar", "--extract", "--numeric-owner", "--same-owner", "--same-permissions",
    "--xattrs", "--xattrs-include=*",
    # overlayfs's own attributes steer the stack: only the layer's opaque markers may set them.
    "--xattrs-exclude=trusted.overlay.*",
    # Directory times and modes at the very end, whatever order the layer lists its entries in.
    "--delay-directory-restore",
    # Unanchored: any path component starting ".wh.", the names _markers reads.
    "--exclude=.wh.*",
]
# Every name on a line of its own: line breaks, backslashes and other unprintable bytes escaped.
_LIST = ["tar", "--list", "--quoting-style=escape"]
_ESCAPE = re.compile(rb"\\([0-7]{3}|.)", re.DOTALL)
_ESCAPED = {b"a": b"\a", b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\\": b"\\"}


@dataclass(frozen=True)
class _Marker:
    """A whiteout (`name` hidden in `directory`) or, with no name, an opaque `directory`."""

    directory: tuple[str, ...]
    name: str | None


def for_this_boot(root: Path) -> LayerTrees:
    """The trees under `root` made since the machine last started. A tree is not synced to disk when it
    is made (syncing the filesystem took as long as the extraction itself), so after a power cut its
    name could stand for files never written: a tree outlives no restart (sweep_other_boots)."""
    return LayerTrees(root / _boot_id())


def sweep_other_boots(root: Path) -> list[str]:
    """The trees made before the machine last started, removed; the names of their directories."""
    if not root.is_dir():
        return []
    gone = sorted(path for path in root.iterdir() if path.name != _boot_id())
    for path in gone:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink()
    return [path.name for path in gone]


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


class LayerTrees:
    """The layers' trees under `root`, each in `root/<hex of its diff_id>`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def tree(self, layout: Layout, diff_id: str) -> Path:
        """The directory holding layer `diff_id` of `layout` (an uncompressed tar blob), extracted now
        unless an earlier call did."""
        blob = layout.blob_path(diff_id)
        final = self.root / hex_of(diff_id)
        if final.is_dir():
            return final
        if not blob.is_file():
            raise LayoutError(f"{layout.root}: no blob {diff_id}")
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._lock(fcntl.LOCK_SH) as lock:
            temporary = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=self.root))
            try:
                os.chmod(temporary, 0o755)  # the root of a layer that has no "./" entry
                _extract(blob, temporary, diff_id, lock)
                _publish(temporary, final)
            except BaseException:
                shutil.rmtree(temporary, ignore_errors=True)
                raise
        return final

    @contextlib.contextmanager
    def filled(self) -> Iterator[tuple[Path, Callable[[str], Path]]]:
        """For a caller that writes a layer's files itself as it writes the layer (wheel_layer.py): yields
        `(directory to fill, name)`, where `name(diff_id)` puts the filled tree in place once the layer's
        digest is known and returns it; a tree the block leaves unnamed goes."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._lock(fcntl.LOCK_SH):
            temporary = Path(tempfile.mkdtemp(prefix=".filled.", suffix=TEMP_SUFFIX, dir=self.root))
            os.chmod(temporary, 0o755)

            def name(diff_id: str) -> Path:
                final = self.root / hex_of(diff_id)
                _publish(temporary, final)
                return final

            try:
                yield temporary, name
            finally:
                shutil.rmtree(temporary, ignore_errors=True)

    def sweep(self) -> list[str]:
        """Remove the temporaries killed extractions left; their names. Nothing while an extraction runs
        (its temporary cannot be told from a dead one's): those wait for the next sweep."""
        if not self.root.is_dir():
            return []
        try:
            with self._lock(fcntl.LOCK_EX | fcntl.LOCK_NB):
                left = sorted(self.root.glob(f".*{TEMP_SUFFIX}"))
                for path in left:
                    shutil.rmtree(path, ignore_errors=True)
        except BlockingIOError:
            return []
        return [path.name for path in left if not path.exists()]

    def _lock(self, operation: int) -> contextlib.AbstractContextManager[IO[str]]:
        return locked(self.root / _LOCK, operation)


def _extract(blob: Path, target: Path, diff_id: str, lock: IO[str]) -> None:
    """GNU tar extracts all but the whiteouts while a second one lists the names; then they are made."""
    tar = subprocess.Popen([*_EXTRACT, "--file", str(blob), "--directory", str(target)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           pass_fds=(lock.fileno(),))
    try:
        markers = _markers(blob, diff_id)
    except BaseException:
        tar.kill()
        tar.wait()
        raise
    _, said = tar.communicate()
    if tar.returncode != 0:
        raise BuildFailure(f"layer {diff_id}: tar could not extract it: {_complaint(said)}")
    for marker in markers:
        _make(target, marker, diff_id)


def _markers(blob: Path, diff_id: str) -> list[_Marker]:
    """The whiteouts and opaque markers among the layer's entries. GNU tar lists the names from the headers
    alone (it seeks over the data; tarfile takes ten times as long), as its extraction reads them."""
    listing = subprocess.run([*_LIST, "--file", str(blob)], stdin=subprocess.DEVNULL, capture_output=True,
                             env={**os.environ, "LC_ALL": "C"}, check=False)
    if listing.returncode != 0:
        raise BuildFailure(f"layer {diff_id} does not read as a tar archive: {_complaint(listing.stderr)}")
    markers = []
    for line in listing.stdout.split(b"\n"):
        if _WHITEOUT_BYTES in line:  # a cheap test first: most entries hold none
            marker = _marker(os.fsdecode(_unescape(line)), diff_id)
            if marker is not None:
                markers.append(marker)
    return markers


def _unescape(name: bytes) -> bytes:
    """A name as `--quoting-style=escape` printed it, back to its bytes."""
    def byte(found: re.Match[bytes]) -> bytes:
        code = found[1]
        return bytes([int(code, 8)]) if len(code) == 3 else _ESCAPED.get(code, code)
    return _ESCAPE.sub(byte, name)


def _complaint(stderr: bytes) -> str:
    """What tar said went wrong, without its harmless warnings and closing line."""
    lines = [line for line in stderr.decode(errors="replace").splitlines()
             if "Removing leading" not in line and "Exiting with failure" not in line]
    return one_line(lines[0] if lines else "no reason given")


def _marker(path: str, diff_id: str) -> _Marker | None:
    """What entry `path` marks; None where ".wh." is only inside a name ("x.wh.y", which tar's
    unanchored pattern leaves alone too) or for aufs's bookkeeping."""
    *directory, name = [part for part in PurePosixPath(path).parts if part != "/"]
    if not name.startswith(_WHITEOUT) and not any(part.startswith(_WHITEOUT) for part in directory):
        return None
    hidden = name.removeprefix(_WHITEOUT)
    if hidden in ("", ".", "..") or ".." in directory or any(part.startswith(_WHITEOUT) for part in directory):
        raise BuildFailure(f"layer {diff_id}: a whiteout entry overlayfs cannot take: {one_line(path)}")
    if name == _OPAQUE:
        return _Marker(tuple(directory), None)
    if name.startswith(_AUFS_META):
        return None
    return _Marker(tuple(directory), hidden)


def _make(target: Path, marker: _Marker, diff_id: str) -> None:
    """The marker as overlayfs reads it, its directory's times left as tar set them."""
    directory = _open_directory(target, marker.directory, diff_id)
    try:
        times = os.stat(directory)
        if marker.name is None:
            os.setxattr(directory, _OPAQUE_XATTR, b"y")
            return
        with contextlib.suppress(FileExistsError):  # the layer holds the path itself, which hides it already
            os.mknod(marker.name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=directory)
        os.utime(directory, ns=(times.st_atime_ns, times.st_mtime_ns))
    finally:
        os.close(directory)


def _open_directory(target: Path, parts: tuple[str, ...], diff_id: str) -> int:
    """A descriptor of `target/parts...`, each component opened without following a symbolic link (a
    layer's link must not carry a whiteout out of the tree); a directory the layer does not list is made."""
    handle = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        try:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=handle)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=handle)
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=handle)
        except OSError as error:  # a symbolic link (ELOOP) or a file (ENOTDIR)
            raise BuildFailure(f"layer {diff_id}: a whiteout under {'/'.join(parts)}, "
                               f"which is not a directory: {error.strerror}") from None
        finally:
            os.close(handle)
        handle = child
    return handle


def _publish(temporary: Path, final: Path) -> None:
    """`temporary` renamed to `final`, unless another extraction got there first: then it goes."""
    try:
        os.rename(temporary, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(temporary)
        return
    handle = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
