"""A Dockerfile COPY from the build context into a root filesystem the builder assembled.

What `buildah copy` does for the steps the templates write (dockerfile_plan.py admits only sources
inside the context): a directory's contents go into the destination, a file goes to the destination
itself, or into it when the destination ends with "/", is a directory already, or several sources are
given. Everything copied is owned by root (0:0) and keeps its permission bits, its mtime and its link
target; a directory the copy has to make is 0755. Paths inside the root are resolved as the image
would resolve them: a symbolic link on the way never leads out of the root.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from builder.errors import BuildFailure

_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup


def inside(root: Path, path: str) -> Path:
    """Where the image path `path` (absolute) is under `root`, following the image's own symbolic links
    as a chroot would: an absolute target starts again at `root`, ".." stops at it. The last component
    is not followed when it is a link (COPY replaces a link, as buildah does)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    resolved: list[str] = []
    followed = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if parts and candidate.is_symlink():
            followed += 1
            if followed > _MAX_LINKS:
                raise BuildFailure(f"COPY to {path}: too many symbolic links in the image")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def _make_directories(root: Path, path: str) -> Path:
    """`path`'s directories made where missing (0755, root's), the last one included; returns it."""
    built = "/"
    for part in [part for part in path.split("/") if part]:
        built = posixpath.join(built, part)
        target = inside(root, built)
        if not os.path.lexists(target):
            target.mkdir(mode=0o755)
            os.chmod(target, 0o755)
            os.lchown(target, 0, 0)
        elif not target.is_dir():
            raise BuildFailure(f"COPY to {path}: {built} is in the image and is not a directory")
    return inside(root, path)


def _copy_entry(source: Path, target: Path) -> None:
    info = os.lstat(source)
    if os.path.lexists(target) and not (stat.S_ISDIR(info.st_mode) and target.is_dir() and not target.is_symlink()):
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    if stat.S_ISDIR(info.st_mode):
        if not os.path.lexists(target):
            target.mkdir()
        for child in sorted(os.listdir(source)):
            _copy_entry(source / child, target / child)
    elif stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISREG(info.st_mode):
        with source.open("rb") as reading, open(target, "xb") as writing:
            shutil.copyfileobj(reading, writing, 1 << 20)
    else:
        raise BuildFailure(f"COPY {source}: only files, directories and symbolic links can be copied")
    os.lchown(target, 0, 0)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(target, stat.S_IMODE(info.st_mode))  # after the chown, which clears setuid bits
    os.utime(target, ns=(info.st_mtime_ns, info.st_mtime_ns), follow_symlinks=False)


def copy_into(root: Path, sources: Sequence[Path], destination: str) -> None:
    """COPY `sources` (host paths) to the image path `destination` (absolute) under `root`."""
    if not sources:
        raise BuildFailure(f"COPY to {destination}: no source")
    into_directory = destination.endswith("/") or len(sources) > 1 or \
        inside(root, destination).is_dir()
    for source in sources:
        if not os.path.lexists(source):
            raise BuildFailure(f"COPY {source.name}: no such file in the build context")
        if os.path.isdir(source) and not source.is_symlink():
            directory = _make_directories(root, destination)
            for child in sorted(os.listdir(source)):
                _copy_entry(source / child, directory / child)
        elif into_directory:
            _copy_entry(source, _make_directories(root, destination) / source.name)
        else:
            parent, _, name = destination.rstrip("/").rpartition("/")
            _copy_entry(source, _make_directories(root, parent or "/") / name)
