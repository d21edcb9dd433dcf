"""One image layer written straight from locked wheels: each wheel unpacked into a virtual
environment's install scheme, as `pip install --no-deps --no-compile` would lay it out, into one tar in
the canonical form (builder/oci/canonical.py), written once into an OCI layout (layout.py).

PyPA's `installer` reads the wheel (WHEEL, entry points, the .data directory and its schemes); the
destination here decides what each file becomes, in pip's form: console scripts with pip's launcher
text and the venv's interpreter in the shebang, `#!python` in .data/scripts rewritten to it, mode 0644
or 0755 (the zip's executable bit), INSTALLER, REQUESTED, and RECORD with pip's rows (paths relative
to site-packages, sorted, CRLF). INSTALLER names this builder, not pip: the one file that differs.

Two passes per layer, because a canonical tar is sorted and RECORD (which sorts inside site-packages)
can only be written once every file's hash is known: the first pass runs `installer` and hashes each
file as it is decompressed, keeping only paths, sizes, hashes and the small generated files; the
second writes the tar in order, streaming each file from the zip into the tar (the zip gives its size
up front) with no copy on disk. A file `installer` rewrote (a script's shebang) is held in memory.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import posixpath
import tarfile
import zipfile
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from installer import install
from installer.destinations import WheelDestination
from installer.exceptions import InstallerError
from installer.records import Hash, RecordEntry
from installer.sources import WheelFile
from installer.utils import Scheme, fix_shebang

from builder.errors import BuildFailure, UserError
from builder.files import sha256_file
from builder.oci import canonical
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


@dataclass(frozen=True)
class WrittenLayer:
    diff_id: str  # the tar's sha256: uncompressed, so also the blob's digest
    size: int
    files: int

    @property
    def digest(self) -> str:
        return self.diff_id


@dataclass(frozen=True)
class _Entry:
    mode: int
    size: int
    member: str | None = None  # streamed from the wheel's zip member of this name
    data: bytes | None = None  # or held in memory
    wheel: int = 0  # which wheel of the layer the member is in


def _record_hash(data_digest: bytes) -> Hash:
    return Hash("sha256", base64.urlsafe_b64encode(data_digest).decode("ascii").rstrip("="))


class _PlanningDestination(WheelDestination):
    """Pass one: where every file of one wheel goes, with its size and hash; only small files kept."""

    def __init__(self, scheme: VenvScheme, distribution: str, wheel: int) -> None:
        self.scheme, self.distribution, self.wheel = scheme, distribution, wheel
        self.entries: dict[str, _Entry] = {}

    def _path(self, scheme: Scheme, path: str) -> str:
        return posixpath.join(self.scheme.directory(scheme, self.distribution), path)

    def _keep(self, scheme: Scheme, path: str, data: bytes, mode: int) -> RecordEntry:
        self.entries[self._path(scheme, path)] = _Entry(mode, len(data), data=data, wheel=self.wheel)
        return RecordEntry(path, _record_hash(hashlib.sha256(data).digest()), len(data))

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
        digest, size = hashlib.sha256(), 0
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        self.entries[self._path(scheme, path)] = _Entry(mode, size, member=member, wheel=self.wheel)
        return RecordEntry(path, _record_hash(digest.digest()), size)

    def finalize_installation(self, scheme: Scheme, record_file_path: str,
                              records: Iterable[tuple[Scheme, RecordEntry]]) -> None:
        """RECORD as pip writes it: each path relative to site-packages, rows sorted, CRLF line ends."""
        site = self.scheme.site_packages
        rows = sorted((posixpath.relpath(self._path(s, r.path), site), str(r.hash_ or ""),
                       "" if r.size is None else str(r.size)) for s, r in records)
        text = io.StringIO(newline="")
        csv.writer(text).writerows(rows)
        self._keep(scheme, record_file_path, text.getvalue().encode(), _FILE_MODE)


def _plan(wheel: WheelFile, scheme: VenvScheme, index: int) -> dict[str, _Entry]:
    destination = _PlanningDestination(scheme, wheel.distribution, index)
    install(wheel, destination, {"INSTALLER": INSTALLER_NAME, "REQUESTED": b""})
    return destination.entries


def _open_locked(stack: ExitStack, locked: LockedWheel) -> tuple[WheelFile, zipfile.ZipFile]:
    """The wheel, once its bytes are the lock's. The file stays open for both passes, so both read the
    bytes that were checked."""
    handle = stack.enter_context(Path(locked.path).open("rb"))
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    if digest.hexdigest() != locked.sha256:
        raise BuildFailure(f"{Path(locked.path).name}: sha256 {digest.hexdigest()}, the lock says {locked.sha256}; "
                           "not installed")
    handle.seek(0)
    try:
        archive = stack.enter_context(zipfile.ZipFile(handle))
        source = WheelFile(archive)
        source.dist_info_dir  # noqa: B018  (reading it checks the wheel's name against its .dist-info)
    except (zipfile.BadZipFile, InstallerError, ValueError) as error:
        raise BuildFailure(f"{Path(locked.path).name}: not a readable wheel: {error}") from None
    return source, archive


def write_wheel_layer(layout: Layout, wheels: Sequence[LockedWheel], scheme: VenvScheme,
                      epoch: int) -> WrittenLayer:
    """One layer holding every file of `wheels` installed into `scheme`, every entry at mtime `epoch`
    (SOURCE_DATE_EPOCH), owned by root; its blob stored in `layout` (or found there: same bytes)."""
    with ExitStack() as stack:
        opened = [_open_locked(stack, wheel) for wheel in wheels]
        entries: dict[str, _Entry] = {}
        for i, (source, _) in enumerate(opened):
            try:
                planned = _plan(source, scheme, i)
            except (InstallerError, ValueError, KeyError) as error:
                raise BuildFailure(f"{Path(wheels[i].path).name}: cannot be installed: {error}") from None
            if clashes := sorted(planned.keys() & entries.keys()):
                raise BuildFailure(f"{clashes[0]}: in both {Path(wheels[entries[clashes[0]].wheel].path).name} "
                                   f"and {Path(wheels[i].path).name}")
            entries.update(planned)
        with layout.blob_writer() as blob:
            _write_tar(blob, entries, [archive for _, archive in opened], epoch)
    return WrittenLayer(blob.digest, blob.size, len(entries))


def _write_tar(sink, entries: dict[str, _Entry], archives: list[zipfile.ZipFile], epoch: int) -> None:
    written_dirs: set[str] = set()
    with tarfile.TarFile(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                         copybufsize=_CHUNK) as tar:
        for path in sorted(entries, key=canonical.written_order):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in written_dirs:
                    written_dirs.add(directory)
                    tar.addfile(_header(directory, tarfile.DIRTYPE, _DIRECTORY_MODE, 0, epoch))
            entry = entries[path]
            header = _header(path, tarfile.REGTYPE, entry.mode, entry.size, epoch)
            if entry.data is not None:
                tar.addfile(header, io.BytesIO(entry.data))
                continue
            with archives[entry.wheel].open(entry.member) as stream:
                tar.addfile(header, stream)  # zipfile checks the member's CRC as it is read


def _header(name: str, kind: bytes, mode: int, size: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, epoch
    info.uid = info.gid = 0
    return canonical.canonical_entry(info)
