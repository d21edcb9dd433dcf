"""Image layers stacked by overlayfs under a fresh upper directory: the root a container step runs on,
its layers (oci/layer_index.py) as the lower directories, its changes in the upper one.

Each stack lives in a directory of its own under the scratch directory: `upper`, `work`, `merged`,
`lowers` (the layers alone, read-only: what a step's layer is told against, oci/tree_layer.py), and
a directory per layer named by its number (`0` the base) on which the layer's EROFS index is mounted
with its tar blob as the data device, for the stack's life only (nothing outlives it to be unmounted by
anyone else). The kernel takes both files as /proc/self/fd paths, and the overlay's options name the
layers by number relative to that directory (`mount` runs there): overlayfs splits its options at ','
and ':' and reads them from one page (4096 bytes; through the newer fsconfig(2), which util-linux 2.39
uses, 256 bytes an option), so thirty layers' long paths, or a path holding either character, would not
fit or would split.

A live stack holds a shared lock on `scratch/.lock`; `sweep` takes it exclusively, so it unmounts and
removes only what killed processes left, never another's live mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure, one_line
from builder.files import detach, locked, remove_scratch
from builder.oci.layer_index import LayerIndex

_PREFIX = "overlay-"
_UNMOUNT_TRIES = 10
_LOCK = ".lock"
# Named, so every host's kernel defaults give the same stack: the upper directory holds each change whole
# (no redirect to a renamed lower directory, no metadata-only copy-up), and a hard link copies up as on
# the engine's mounts (no inode index). xino: each layer is a filesystem of its own (EROFS), and without
# it two files of two layers can show one inode number on one device (a hard link, to `tar` or `cp -a`)
# and a directory's number is one overlayfs makes up per cached inode; with it, each number is the
# layer's own with the layer's filesystem in its high bits, the same before and after a copy-up.
_FEATURES = "redirect_dir=off,metacopy=off,index=off,xino=on"
_MS_RDONLY = 1
_libc = ctypes.CDLL(None, use_errno=True)
# A layer whose tar lists no root directory: the root as the engine's storage makes it.
_DEFAULT_ROOT = (0, 0, 0o755)


@dataclass(frozen=True)
class Stack:
    merged: Path  # the root the step sees
    upper: Path  # what the step changed, as overlayfs records it
    lowers: Path  # the layers alone, read-only: the root as it was when the stack was made


@contextlib.contextmanager
def stacked(lowers: Sequence[LayerIndex], scratch: Path) -> Iterator[Stack]:
    """`lowers` (the base first) mounted under a fresh upper directory below `scratch` for the block;
    unmounted and removed after it, also when it raised."""
    if not lowers:
        raise BuildFailure("overlay: no layers to stack")
    for lower in lowers:
        if not (lower.index.is_file() and lower.blob.is_file()):
            raise BuildFailure(f"overlay: layer {lower.diff_id} is not there ({lower.index}, {lower.blob})")
    scratch = Path(scratch)
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock(scratch, fcntl.LOCK_SH):
        place = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=scratch))
        try:
            stack = _mount(_each_once(lowers), place)
        except BaseException:
            remove_scratch(place)
            raise
        try:
            yield stack
        finally:
            _unmount(stack.merged)
            remove_scratch(place)


def sweep(scratch: Path) -> list[str]:
    """Unmount and remove the stacks killed processes left under `scratch`; their names. Nothing while a
    stack is live there (the dead cannot be told from it): those wait for the next sweep."""
    scratch = Path(scratch)
    if not scratch.is_dir():
        return []
    try:
        with _lock(scratch, fcntl.LOCK_EX | fcntl.LOCK_NB):
            left = sorted(scratch.glob(f"{_PREFIX}*"))
            for path in left:
                remove_scratch(path)
    except BlockingIOError:
        return []
    return [path.name for path in left if not path.exists()]


def _lock(scratch: Path, operation: int) -> contextlib.AbstractContextManager[IO[str]]:
    return locked(scratch / _LOCK, operation)


def _each_once(lowers: Sequence[LayerIndex]) -> list[LayerIndex]:
    """Each layer once, at its topmost place: overlayfs refuses one directory named twice (an image may
    hold a layer twice, two steps that made the same files), and all a lower copy holds the upper one
    holds too."""
    kept: list[LayerIndex] = []
    for lower in reversed(lowers):
        if all(lower.diff_id != other.diff_id for other in kept):
            kept.append(lower)
    return kept[::-1]


def _mount(lowers: list[LayerIndex], place: Path) -> Stack:
    upper, work, merged = place / "upper", place / "work", place / "merged"
    for directory in (upper, work, merged):
        directory.mkdir()
    for number, lower in enumerate(lowers):
        _mount_layer(lower, place / str(number))
    # The merged root is the upper root: it takes the image's root as the topmost layer that lists
    # one has it, as the engine's storage does.
    uid, gid, mode = _DEFAULT_ROOT
    for number in reversed(range(len(lowers))):
        if lowers[number].lists_root:
            top = os.stat(place / str(number))
            uid, gid, mode = top.st_uid, top.st_gid, stat.S_IMODE(top.st_mode)
            break
    os.chown(upper, uid, gid)
    os.chmod(upper, mode)
    topmost_first = ":".join(str(number) for number in reversed(range(len(lowers))))
    options = f"lowerdir={topmost_first},upperdir=upper,workdir=work,{_FEATURES}"
    _mount_overlay(options, merged, place, len(lowers))
    if len(lowers) == 1:
        return Stack(merged=merged, upper=upper, lowers=place / "0")
    # overlayfs stacks two layers or more without an upper directory, read-only.
    lowers_only = place / "lowers"
    lowers_only.mkdir()
    _mount_overlay(f"lowerdir={topmost_first},{_FEATURES}", lowers_only, place, len(lowers))
    return Stack(merged=merged, upper=upper, lowers=lowers_only)


def _mount_overlay(options: str, target: Path, place: Path, layers: int) -> None:
    with _kernel_log() as kernel:
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(target)], cwd=place,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            said = "; ".join(_kernel_lines(kernel, "overlayfs:")) or (
                mounted.stderr.strip().splitlines() or ["no reason"])[0]
            raise BuildFailure(f"overlay: mounting {layers} layers on {target} failed: {one_line(said)}")


def _mount_layer(lower: LayerIndex, target: Path) -> None:
    """The layer's index mounted read-only on `target`, its blob the data device (a file-backed EROFS
    mount: no loop device). mount(2) itself: util-linux's `mount` would put a loop device under the
    index, and the kernel then takes no file as the data device."""
    target.mkdir()
    index = os.open(lower.index, os.O_RDONLY | os.O_CLOEXEC)
    try:
        blob = os.open(lower.blob, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _kernel_log() as kernel:
                if _libc.mount(f"/proc/self/fd/{index}".encode(), os.fsencode(target), b"erofs", _MS_RDONLY,
                               f"device=/proc/self/fd/{blob}".encode()) != 0:
                    error = ctypes.get_errno()
                    said = "; ".join(_kernel_lines(kernel, "erofs")) or os.strerror(error)
                    raise BuildFailure(f"overlay: mounting layer {lower.diff_id} failed: {one_line(said)}")
        finally:
            os.close(blob)
    finally:
        os.close(index)


def _unmount(merged: Path) -> None:
    # A container's last processes can hold the root a while after the engine reports it removed ("target
    # is busy": seen once in eight checks run at once, and for longer than the tries below when the
    # checks ran at low priority beside a busy foreground). They are being killed, so after a few tries
    # the root is detached (umount2 MNT_DETACH): it leaves the mount table now, and the kernel frees it
    # when the last of them lets go.
    for _ in range(_UNMOUNT_TRIES):
        unmounted = subprocess.run(["umount", str(merged)], stdin=subprocess.DEVNULL, capture_output=True,
                                   text=True, check=False)
        if unmounted.returncode == 0:
            return
        time.sleep(0.5)
    if not detach(merged):
        said = one_line((unmounted.stderr.strip().splitlines() or ["no reason"])[0])
        raise BuildFailure(f"overlay: could not unmount {merged} ({said}); the next sweep removes it")


@contextlib.contextmanager
def _kernel_log() -> Iterator[int | None]:
    """The kernel log from now on (None where it cannot be read): overlayfs says why a mount failed
    there, where util-linux's `mount` (2.38) only says that it did."""
    try:
        handle: int | None = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        handle = None
    try:
        if handle is not None:
            os.lseek(handle, 0, os.SEEK_END)
        yield handle
    finally:
        if handle is not None:
            os.close(handle)


def _kernel_lines(kernel: int | None, prefix: str) -> list[str]:
    """The messages starting with `prefix` among the records written since `_kernel_log` began
    ("PRIO,SEQ,TIME,FLAGS;TEXT")."""
    if kernel is None:
        return []
    lines = []
    while True:
        try:
            record = os.read(kernel, 8192).decode(errors="replace")
        except BrokenPipeError:
            continue  # records overwritten before this read: the next read goes on after them
        except BlockingIOError:
            return lines
        message = record.partition(";")[2].split("\n", 1)[0]
        if message.startswith(prefix):
            lines.append(message)
