"""One image layer written straight from locked wheels: each wheel unpacked into a virtual
environment's install scheme, as `pip install --no-deps --no-compile` would lay it out, into one tar in
the canonical form (builder/oci/canonical.py), written once into an OCI layout (layout.py).

PyPA's `installer` reads the wheel (WHEEL, entry points, the .data directory and its schemes); the
destination here decides what each file becomes, in pip's form: console scripts with pip's launcher
text and the venv's interpreter in the shebang, `#!python` in .data/scripts rewritten to it, mode 0644
or 0755 (the zip's executable bit), INSTALLER, REQUESTED, and RECORD with pip's rows (paths relative
to site-packages, sorted, CRLF). INSTALLER names this builder, not pip: the one file that differs.

Two passes per layer, because a canonical tar is sorted and RECORD (which sorts inside site-packages)
can only be written once every file's hash is known: the first pass runs `installer` and keeps only
paths, sizes, hashes and the small generated files; the second writes the tar in order, streaming each
file from the zip into the tar (the zip gives its size up front) with no copy on disk. A file
`installer` rewrote (a script's shebang) is held in memory. The first pass takes a file's hash from
the wheel's own RECORD where it gives one (decompressing a wheel is most of the pass's time), and the
second checks it as the file streams by: a RECORD that lies fails the layer. A file RECORD gives no
sha256 for is decompressed and hashed in the first pass.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import posixpath
import re
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from installer import install
from installer.destinations import WheelDestination
from installer.exceptions import InstallerError
from installer.records import Hash, RecordEntry, parse_record_file
from installer.sources import WheelFile
from installer.utils import Scheme, fix_shebang

from builder.errors import BuildFailure, UserError
from builder.files import sha256_file
from builder.oci import canonical, layer_listing, zip_member
from builder.oci.tree_layer import WrittenLayer
from builder.oci.layout import Layout

INSTALLER_NAME = b"sglang-image-builder\n"
_CHUNK = 1 << 20
_FILE_MODE, _EXECUTABLE_MODE, _DIRECTORY_MODE = 0o644, 0o755, 0o755
# pip's console-script launcher, as pip 26 writes it (PipScriptMaker.script_template; older pips
# used distlib's, which imports `re`): equal files need the image's pip to be this one.
_LAUNCHER = """import sys
from {module} import {import_name}
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit({func}())
"""
# Longer shebangs, or ones with spaces, get distlib's /bin/sh trampoline instead: not written here.
_MAX_SHEBANG = 127


@dataclass(frozen=True)
class LockedWheel:
    path: Path
    sha256: str  # hex, as the lock records it


@dataclass(frozen=True)
class VenvScheme:
    """Where a virtual environment at `prefix` (absolute, in the image) installs, for Python `version`
    ("3.11"); `interpreter` goes into the scripts' shebangs (pip writes the one it runs under)."""

    prefix: str
    version: str
    interpreter: str

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or not self.interpreter.startswith("/"):
            raise UserError(f"venv {self.prefix!r} and interpreter {self.interpreter!r} must be absolute paths")
        if " " in self.interpreter or len(self.interpreter) + 3 > _MAX_SHEBANG:
            raise UserError(f"interpreter {self.interpreter!r}: a shebang needs a path with no spaces and at "
                            f"most {_MAX_SHEBANG - 3} characters")

    @property
    def site_packages(self) -> str:
        return f"{self.prefix}/lib/python{self.version}/site-packages".lstrip("/")

    def directory(self, scheme: str, distribution: str) -> str:
        """The scheme's directory, relative to the image's root (pip's venv scheme)."""
        root = self.prefix.lstrip("/")
        return {"purelib": self.site_packages, "platlib": self.site_packages, "scripts": f"{root}/bin",
                "data": root, "headers": f"{root}/include/site/python{self.version}/{distribution}"}[scheme]


PLAN_FORMAT = 1


@dataclass(frozen=True)
class PlannedFile:
    """One regular file of the layer: its path relative to the image's root, its mode and size, and
    where its bytes come from: a member of one of the plan's wheels, or the plan itself."""

    path: str
    mode: int
    size: int
    wheel: int | None = None  # index into WheelPlan.wheels
    member: str | None = None
    data: bytes | None = None
    sha256: str | None = None  # hex: the wheel's RECORD says so, and writing the layer checks it


@dataclass(frozen=True)
class WheelPlan:
    """Every file a group of wheels installs, in the layer's order. It is the one description both
    writers carry out: the builder's tar writer (write_planned_layer) and the image's own tool
    (builder/runtime/install_wheels.py), which a plain engine build of the rendered Dockerfile runs."""

    wheels: tuple[tuple[str, str], ...]  # (file name, sha256 hex), as the lock records them
    files: tuple[PlannedFile, ...]

    def to_json(self) -> bytes:
        files = [{"path": f.path, "mode": f.mode, "size": f.size,
                  **({"data": base64.b64encode(f.data).decode("ascii")} if f.data is not None
                     else {"wheel": f.wheel, "member": f.member}),
                  **({"sha256": f.sha256} if f.sha256 is not None else {})} for f in self.files]
        document = {"format": PLAN_FORMAT, "wheels": [{"file": name, "sha256": sha} for name, sha in self.wheels],
                    "files": files}
        return (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str) -> WheelPlan:
        try:
            document = json.loads(data)
            if document["format"] != PLAN_FORMAT:
                raise ValueError(f"format {document['format']!r}, this builder reads {PLAN_FORMAT}")
            wheels = tuple((str(w["file"]), str(w["sha256"])) for w in document["wheels"])
            files = tuple(PlannedFile(str(f["path"]), int(f["mode"]), int(f["size"]),
                                      None if "data" in f else int(f["wheel"]),
                                      None if "data" in f else str(f["member"]),
                                      base64.b64decode(f["data"], validate=True) if "data" in f else None,
                                      None if "sha256" not in f else str(f["sha256"]))
                          for f in document["files"])
        except (ValueError, KeyError, TypeError) as error:
            raise BuildFailure(f"{origin}: not a wheel plan: {error}") from None
        for planned in files:
            if not canonical_path(planned.path) or planned.mode not in (_FILE_MODE, _EXECUTABLE_MODE) or \
                    (planned.data is None and not 0 <= planned.wheel < len(wheels)) or \
                    (planned.sha256 is not None and not _SHA256_HEX.fullmatch(planned.sha256)):
                raise BuildFailure(f"{origin}: not a wheel plan: bad entry {planned.path!r}")
        return cls(wheels, files)


def canonical_path(path: str) -> bool:
    """A plan's path: relative, '/'-separated, with no empty, '.' or '..' part."""
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def recorded_digests(source: WheelFile) -> dict[str, bytes]:
    """The sha256 the wheel's RECORD gives each member, where it gives one in a well-formed entry."""
    found = {}
    for path, hash_text, _ in parse_record_file(source.read_dist_info("RECORD").splitlines()):
        name, _, value = hash_text.partition("=")
        if name != "sha256":
            continue
        with contextlib.suppress(ValueError):
            digest = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            if len(digest) == 32 and _record_hash(digest).value == value:
                found[path] = digest
    return found


def _record_hash(data_digest: bytes) -> Hash:
    return Hash("sha256", base64.urlsafe_b64encode(data_digest).decode("ascii").rstrip("="))


class _PlanningDestination(WheelDestination):
    """Pass one: where every file of one wheel goes, with its size and hash; only small files kept."""

    def __init__(self, scheme: VenvScheme, distribution: str, wheel: int, archive: zipfile.ZipFile,
                 recorded: dict[str, bytes]) -> None:
        self.scheme, self.distribution, self.wheel = scheme, distribution, wheel
        self.archive, self.recorded = archive, recorded
        self.entries: dict[str, PlannedFile] = {}
        self.digests: dict[str, bytes] = {}  # each file's sha256, to tell a clash from the same file twice

    def _path(self, scheme: Scheme, path: str) -> str:
        return posixpath.join(self.scheme.directory(scheme, self.distribution), path)

    def _keep(self, scheme: Scheme, path: str, data: bytes, mode: int) -> RecordEntry:
        target = self._path(scheme, path)
        self.entries[target] = PlannedFile(target, mode, len(data), data=data)
        self.digests[target] = hashlib.sha256(data).digest()
        return RecordEntry(path, _record_hash(self.digests[target]), len(data))

    def write_script(self, name: str, module: str, attr: str, section: str) -> RecordEntry:
        text = f"#!{self.scheme.interpreter}\n" + _LAUNCHER.format(
            module=module, import_name=attr.split(".")[0], func=attr)
        return self._keep("scripts", name, text.encode(), _EXECUTABLE_MODE)

    def write_file(self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool) -> RecordEntry:
        mode = _EXECUTABLE_MODE if is_executable else _FILE_MODE
        if scheme == "scripts":
            with fix_shebang(stream, self.scheme.interpreter) as fixed:
                if fixed is not stream:
                    return self._keep(scheme, path, fixed.read(), mode)
        member = getattr(stream, "name", None)
        if not isinstance(stream, zipfile.ZipExtFile) or not isinstance(member, str):
            return self._keep(scheme, path, stream.read(), mode)  # INSTALLER, REQUESTED: installer's BytesIO
        target = self._path(scheme, path)
        recorded = self.recorded.get(member)
        if recorded is not None:  # on RECORD's word, checked when the layer is written
            size = self.archive.getinfo(member).file_size
            self.entries[target] = PlannedFile(target, mode, size, wheel=self.wheel, member=member,
                                               sha256=recorded.hex())
            self.digests[target] = recorded
            return RecordEntry(path, _record_hash(recorded), size)
        digest, size = hashlib.sha256(), 0
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        self.entries[target] = PlannedFile(target, mode, size, wheel=self.wheel, member=member)
        self.digests[target] = digest.digest()
        return RecordEntry(path, _record_hash(self.digests[target]), size)

    def finalize_installation(self, scheme: Scheme, record_file_path: str,
                              records: Iterable[tuple[Scheme, RecordEntry]]) -> None:
        """RECORD as pip writes it: each path relative to site-packages, rows sorted, CRLF line ends."""
        site = self.scheme.site_packages
        rows = sorted((posixpath.relpath(self._path(s, r.path), site), str(r.hash_ or ""),
                       "" if r.size is None else str(r.size)) for s, r in records)
        text = io.StringIO(newline="")
        csv.writer(text).writerows(rows)
        self._keep(scheme, record_file_path, text.getvalue().encode(), _FILE_MODE)


def _plan(wheel: WheelFile, archive: zipfile.ZipFile, scheme: VenvScheme, index: int) -> _PlanningDestination:
    destination = _PlanningDestination(scheme, wheel.distribution, index, archive, recorded_digests(wheel))
    install(wheel, destination, {"INSTALLER": INSTALLER_NAME, "REQUESTED": b""})
    return destination


def _open_locked(stack: ExitStack, path: Path, sha256: str, file_digest: Callable[[Path], str] = sha256_file
                 ) -> tuple[WheelFile, zipfile.ZipFile, int]:
    """The wheel, once its bytes are the lock's, and its open file's descriptor. The file stays open
    while it is read, so what is read is what was checked (`file_digest` may answer from a memo of the
    file's identity)."""
    handle = stack.enter_context(Path(path).open("rb"))
    digest = file_digest(Path(path))
    if digest != sha256:
        raise BuildFailure(f"{Path(path).name}: sha256 {digest}, the lock says {sha256}; not installed")
    try:
        archive = stack.enter_context(zipfile.ZipFile(handle))
        source = WheelFile(archive)
        source.dist_info_dir  # noqa: B018  (reading it checks the wheel's name against its .dist-info)
    except (zipfile.BadZipFile, InstallerError, ValueError) as error:
        raise BuildFailure(f"{Path(path).name}: not a readable wheel: {error}") from None
    return source, archive, handle.fileno()


def plan_layer(wheels: Sequence[LockedWheel], scheme: VenvScheme,
               file_digest: Callable[[Path], str] = sha256_file) -> WheelPlan:
    """Every file `wheels` install into `scheme` (pass one: each member decompressed and hashed once,
    for RECORD); two wheels that write one path with different content are refused. The wheels' order
    does not matter. `file_digest` may answer from a record of the file's identity (_open_locked)."""
    ordered = sorted(wheels, key=lambda wheel: (Path(wheel.path).name, str(wheel.path)))
    files: dict[str, PlannedFile] = {}
    digests: dict[str, bytes] = {}
    origin: dict[str, int] = {}  # which wheel each path comes from (a generated file has no member)
    with ExitStack() as stack:
        for i, locked in enumerate(ordered):
            source, archive, _ = _open_locked(stack, locked.path, locked.sha256, file_digest)
            try:
                planned = _plan(source, archive, scheme, i)
            except (InstallerError, ValueError, KeyError) as error:
                raise BuildFailure(f"{Path(locked.path).name}: cannot be installed: {error}") from None
            # The same file in two wheels (the CUDA 12 wheels' empty nvidia/__init__.py) is one file,
            # whichever pip wrote last; different files under one path would make the install order matter.
            for path in sorted(planned.entries.keys() & files.keys()):
                if planned.digests[path] != digests[path] or planned.entries[path].mode != files[path].mode:
                    raise BuildFailure(f"{path}: in both {Path(ordered[origin[path]].path).name} "
                                       f"and {Path(locked.path).name}, with different content")
                del planned.entries[path]
            files.update(planned.entries)
            digests.update(planned.digests)
            origin.update(dict.fromkeys(planned.entries, i))
    return WheelPlan(tuple((Path(w.path).name, w.sha256) for w in ordered),
                     tuple(files[path] for path in sorted(files, key=canonical.written_order)))


def write_planned_layer(layout: Layout, plan: WheelPlan, wheel_dir: Path, epoch: int,
                        file_digest: Callable[[Path], str] = sha256_file,
                        directories: Sequence[str] = (), stop: threading.Event | None = None) -> WrittenLayer:
    """Pass two: the plan's files, read from its wheels in `wheel_dir` (each checked against the plan's
    sha256 first), as one canonical tar with every entry at mtime `epoch` (SOURCE_DATE_EPOCH), owned by
    root; its blob stored in `layout` (or found there: same bytes). `directories` (relative to the
    image's root, mode 0755) are in the layer too: what the engine leaves in the step's layer besides.
    Once `stop` is set (by another thread) the writing ends, its temporary blob removed."""
    with ExitStack() as stack:
        archives = [_open_locked(stack, wheel_dir / name, sha256, file_digest)[1:] for name, sha256 in plan.wheels]
        with layout.blob_writer() as blob:
            listing = _write_tar(blob, plan.files, directories, archives, epoch, stop or threading.Event())
    return WrittenLayer(blob.digest, blob.size, tuple(listing))


def write_wheel_layer(layout: Layout, wheels: Sequence[LockedWheel], scheme: VenvScheme,
                      epoch: int) -> WrittenLayer:
    """Both passes, for wheels that lie in one directory."""
    directories = {Path(wheel.path).parent for wheel in wheels}
    if len(directories) != 1:
        raise UserError(f"the wheels of one layer must lie in one directory, not {len(directories)}")
    return write_planned_layer(layout, plan_layer(wheels, scheme), directories.pop(), epoch)


def _write_tar(sink, files: Sequence[PlannedFile], directories: Sequence[str],
               archives: list[tuple[zipfile.ZipFile, int]], epoch: int, stop: threading.Event) -> list[layer_listing.Row]:
    written_dirs: set[str] = set()
    listing: list[layer_listing.Row] = []
    entries = sorted([*((f.path, f) for f in files), *((d, None) for d in directories)],
                     key=lambda entry: canonical.written_order(entry[0]))
    with tarfile.TarFile(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                         copybufsize=_CHUNK) as tar:
        for path, planned in entries:
            if stop.is_set():
                raise BuildFailure("stopped: the build failed elsewhere")
            parts = path.split("/")
            for depth in range(1, len(parts) + (planned is None)):
                directory = "/".join(parts[:depth])
                if directory not in written_dirs:
                    written_dirs.add(directory)
                    tar.addfile(_header(directory, tarfile.DIRTYPE, _DIRECTORY_MODE, 0, epoch))
                    listing.append((layer_listing.absolute(directory), "dir", ""))
            if planned is None:
                continue
            header = _header(planned.path, tarfile.REGTYPE, planned.mode, planned.size, epoch)
            listing.append((layer_listing.absolute(planned.path), "file", ""))
            if planned.data is not None:
                tar.addfile(header, io.BytesIO(planned.data))
                continue
            archive, descriptor = archives[planned.wheel]
            with zip_member.open_member(archive, descriptor, planned.member) as stream:
                checked = _Checked(stream) if planned.sha256 is not None else None
                tar.addfile(header, checked or stream)  # the member's CRC is checked as it is read
            if checked is not None and checked.digest.hexdigest() != planned.sha256:
                raise BuildFailure(f"{Path(str(archive.filename)).name}: {planned.member} has sha256 "
                                   f"{checked.digest.hexdigest()}, its RECORD says {planned.sha256}; not installed")
    return listing


class _Checked:
    """A member's stream, hashed as the tar reads it."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.digest = stream, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
        return data


def _header(name: str, kind: bytes, mode: int, size: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, epoch
    info.uid = info.gid = 0
    return canonical.canonical_entry(info)
