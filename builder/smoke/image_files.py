"""An image's files as its layers make them, read from the layers' tars: which layer gives each path.

The smoke results are kept with what each check read (smoke/keyed_results.py); whether a read would give
another answer in another image is told here. A path's identity is the layer that gives it (a layer is
named by its content, so the same layer gives the same bytes), with every symbolic link followed on the
way, and a directory's listing is the names in it. A regular file of a small layer is named by its own
bytes, mode, owner and time instead (oci/layer_listing.file_digests): a layer of in-image tools that
changed one file then leaves the checks that read only its other files standing. Layer tars are
uncompressed (the write-once layout's blobs); their listings are kept under `listings_dir` by diff_id
(oci/layer_listing.py), so each layer is read once at most: the write-once build keeps the listing of
every layer it writes.
"""

from __future__ import annotations

import hashlib
import posixpath
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.oci.layer_listing import absolute, file_digests, listing

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_MAX_LINKS = 40  # the kernel's limit on links followed in one lookup
ABSENT = "absent"


@dataclass(frozen=True)
class Entry:
    layer: str  # diff_id of the layer that gives the path
    kind: str  # "dir", "file", "link" (symbolic), "hardlink", "other"
    target: str  # a link's target, else ""


class ImageFiles:
    """The merged view of an image's layers, bottom first: whiteouts and opaque directories applied."""

    def __init__(self, layers: Sequence[tuple[str, Path]], listings_dir: Path) -> None:
        self.diff_ids = tuple(diff_id for diff_id, _ in layers)
        self._tars = dict(layers)
        self._listings_dir = listings_dir
        self._digests: dict[str, dict[str, str]] = {}
        self.entries: dict[str, Entry] = {"/": Entry("", "dir", "")}
        for diff_id, tar_path in layers:
            self._apply(diff_id, listing(tar_path, diff_id, listings_dir))
        self._children: dict[str, list[str]] | None = None
        # Each check's kept run is held to this view path by path: the directories on the way are walked
        # once for all the paths in them (resolve).
        self._walked: dict[tuple[str, ...], tuple[str, tuple[str, ...], int, bool]] = {}

    def _apply(self, diff_id: str, rows: list[tuple[str, str, str]]) -> None:
        for path, _kind, _target in rows:  # what this layer hides in the layers below
            name, parent = posixpath.basename(path), posixpath.dirname(path)
            if name == _OPAQUE:
                self._remove_below(parent)
            elif name.startswith(_WHITEOUT):
                removed = posixpath.join(parent, name[len(_WHITEOUT):])
                self.entries.pop(removed, None)
                self._remove_below(removed)
        for path, kind, target in rows:
            if posixpath.basename(path).startswith(_WHITEOUT):
                continue
            below = self.entries.get(path)
            if below is not None and below.kind == "dir" and kind != "dir":
                self._remove_below(path)
            self.entries[path] = Entry(diff_id, kind, target)

    def _remove_below(self, directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        for path in [path for path in self.entries if path.startswith(prefix)]:
            del self.entries[path]

    def resolve(self, path: str, follow_last: bool = True) -> tuple[str, list[str]]:
        """The path a lookup of `path` ends on, and each link followed to get there (with its layer)."""
        parts = [part for part in posixpath.normpath("/" + path).split("/") if part]
        if not parts:
            return "/", []
        # Where the lookup stands before the last part: the same for every path of one directory, so
        # walked once. A link on the way there is always followed (the last part is still to come).
        parent = tuple(parts[:-1])
        walked = self._walked.get(parent)
        if walked is None:
            walked = self._walked[parent] = self._walk("/", (), 0, list(parts), keep=1, follow_last=True)
        current, links, hops, gave_up = walked
        if not gave_up:
            current, links, hops, gave_up = self._walk(current, links, hops, [parts[-1]], keep=0,
                                                       follow_last=follow_last)
        return current, list(links)

    def _walk(self, current: str, links: tuple[str, ...], hops: int, pending: list[str], keep: int,
              follow_last: bool) -> tuple[str, tuple[str, ...], int, bool]:
        """The lookup from `current` until `keep` parts are left pending: where it stands, the links
        followed, how many, and whether it gave up on a loop of links (ending where it stood)."""
        followed = list(links)
        while len(pending) > keep:
            part = pending.pop(0)
            candidate = posixpath.normpath(posixpath.join(current, part))
            entry = self.entries.get(candidate)
            if entry is not None and entry.kind == "link" and (pending or follow_last):
                hops += 1
                followed.append(f"{candidate}->{entry.target}@{entry.layer}")
                if hops > _MAX_LINKS:
                    return candidate, tuple(followed), hops, True
                base = "/" if entry.target.startswith("/") else current
                pending = [p for p in entry.target.split("/") if p] + pending
                current = base
                continue
            current = candidate
        return current, tuple(followed), hops, False

    def identity(self, path: str, follow_last: bool = True) -> str:
        """What reading `path` gives, as a comparable string: the layer giving it (a small layer's file: its
        digest) and the links on the way."""
        final, links = self.resolve(path, follow_last)
        entry = self.entries.get(final)
        if entry is None:
            given = ABSENT
        elif entry.kind == "dir":
            # Every layer that changes something below a directory carries its entry again: what a
            # directory gives is its names (listing), not the layer that last carried it.
            given = "dir"
        elif entry.kind == "hardlink":
            given = f"hardlink:{entry.target}@{entry.layer}"
        elif entry.kind == "file" and (digest := self._file_digest(entry.layer, final)) is not None:
            given = f"file#{digest}"
        else:
            given = f"{entry.kind}@{entry.layer}"
        return "|".join([*links, given])

    def _file_digest(self, diff_id: str, path: str) -> str | None:
        if diff_id not in self._digests:
            self._digests[diff_id] = file_digests(self._tars[diff_id], diff_id, self._listings_dir) or {}
        return self._digests[diff_id].get(path)

    def listing(self, directory: str) -> str:
        """The names in a directory, after links, as one digest (ABSENT where it is none)."""
        final, links = self.resolve(directory)
        entry = self.entries.get(final)
        if entry is None or entry.kind != "dir":
            return "|".join([*links, ABSENT])
        names = sorted(self._children_of().get(final, ()))
        return "|".join([*links, hashlib.sha256("\0".join(names).encode()).hexdigest()])

    def _children_of(self) -> dict[str, list[str]]:
        if self._children is None:
            self._children = {}
            for path in self.entries:
                if path != "/":
                    self._children.setdefault(posixpath.dirname(path), []).append(posixpath.basename(path))
        return self._children

    def read_small(self, path: str, limit: int = 1 << 20) -> bytes | None:
        """A small file's bytes from the layer that gives it (the stack description); None when absent."""
        final, _ = self.resolve(path)
        entry = self.entries.get(final)
        if entry is None or entry.kind != "file":
            return None
        with tarfile.open(self._tars[entry.layer], "r:") as tar:
            for member in tar:
                if absolute(member.name) == final and member.isfile():
                    if member.size > limit:
                        return None
                    handle = tar.extractfile(member)
                    return handle.read() if handle else None
        return None
