"""Image layers stacked by overlayfs under a fresh upper directory: the root a container step runs on,
its layers' trees (oci/layer_tree.py) as the lower directories, its changes in the upper one.

Each stack lives in a directory of its own under the scratch directory: `upper`, `work`, `merged`, and
a symbolic link to each lower directory named by its number (`0` the base), which the mount options name
relative to that directory (`mount` runs there). overlayfs splits its options at ',' and ':' and reads
them from one page (4096 bytes; through the newer fsconfig(2), which util-linux 2.39 uses, 256 bytes an
option), so thirty layers' long paths, or a path holding either character, would not fit or would split.

A live stack holds a shared lock on `scratch/.lock`; `sweep` takes it exclusively, so it unmounts and
removes only what killed processes left, never another's live mount.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure, one_line
from builder.files import locked, remove_scratch

_PREFIX = "overlay-"
_UNMOUNT_TRIES = 10
_LOCK = ".lock"
# Named, so every host's kernel defaults give the same stack: the upper directory holds each change whole
# (no redirect to a renamed lower directory, no metadata-only copy-up), and a hard link copies up as on
# the engine's mounts (no inode index).
_FEATURES = "redirect_dir=off,metacopy=off,index=off"


@dataclass(frozen=True)
class Stack:
    merged: Path  # the root the step sees
    upper: Path  # what the step changed, as overlayfs records it


@contextlib.contextmanager
def stacked(lowers: Sequence[Path], scratch: Path) -> Iterator[Stack]:
    """`lowers` (the base first) mounted under a fresh upper directory below `scratch` for the block;
    unmounted and removed after it, also when it raised."""
    if not lowers:
        raise BuildFailure("overlay: no layers to stack")
    for lower in lowers:
        if not Path(lower).is_dir():
            raise BuildFailure(f"overlay: the layer directory {lower} is not there")
    scratch = Path(scratch)
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock(scratch, fcntl.LOCK_SH):
        place = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=scratch))
        try:
            stack = _mount(_each_once(lowers), place)
        except BaseException:
            shutil.rmtree(place, ignore_errors=True)
            raise
        try:
            yield stack
        finally:
            _unmount(stack.merged)
            shutil.rmtree(place)


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


def _each_once(lowers: Sequence[Path]) -> list[Path]:
    """Each directory once, at its topmost place: overlayfs refuses one named twice (an image may hold a
    layer twice, two steps that made the same files), and all a lower copy holds the upper one holds too."""
    kept: list[Path] = []
    for lower in reversed([Path(lower).resolve() for lower in lowers]):
        if lower not in kept:
            kept.append(lower)
    return kept[::-1]


def _mount(lowers: list[Path], place: Path) -> Stack:
    upper, work, merged = place / "upper", place / "work", place / "merged"
    for directory in (upper, work, merged):
        directory.mkdir()
    # The merged root is the upper root: it takes the image's root as the topmost layer has it.
    top = os.stat(lowers[-1])
    os.chown(upper, top.st_uid, top.st_gid)
    os.chmod(upper, stat.S_IMODE(top.st_mode))
    for number, lower in enumerate(lowers):
        os.symlink(lower, place / str(number))
    topmost_first = ":".join(str(number) for number in reversed(range(len(lowers))))
    options = f"lowerdir={topmost_first},upperdir=upper,workdir=work,{_FEATURES}"
    with _kernel_log() as kernel:
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], cwd=place,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            said = "; ".join(_overlay_lines(kernel)) or (mounted.stderr.strip().splitlines() or ["no reason"])[0]
            raise BuildFailure(f"overlay: mounting {len(lowers)} layers on {merged} failed: {one_line(said)}")
    return Stack(merged=merged, upper=upper)


def _unmount(merged: Path) -> None:
    # A container's last process can hold the root a moment after the engine reports it removed ("target
    # is busy", seen once in eight checks run at once): a few tries before giving up.
    for _ in range(_UNMOUNT_TRIES):
        unmounted = subprocess.run(["umount", str(merged)], stdin=subprocess.DEVNULL, capture_output=True,
                                   text=True, check=False)
        if unmounted.returncode == 0:
            return
        time.sleep(0.5)
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


def _overlay_lines(kernel: int | None) -> list[str]:
    """overlayfs's messages among the records written since `_kernel_log` began ("PRIO,SEQ,TIME,FLAGS;TEXT")."""
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
        if message.startswith("overlayfs:"):
            lines.append(message)
