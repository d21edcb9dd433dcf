"""A wheel's members read through ISA-L (builder/oci/zip_member.py): the same bytes zipfile gives, in
any read size, for stored, deflated, empty, highly compressible and ZIP64 members; a damaged member or
archive is refused in one line; what it does not read itself (bzip2) it leaves to zipfile."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from builder.errors import BuildFailure
from builder.oci.zip_member import open_member

MEMBERS = {
    "stored.txt": (zipfile.ZIP_STORED, b"plain bytes\n" * 1000),
    "fast.bin": (zipfile.ZIP_DEFLATED, os.urandom(3 << 20)),
    "zeros.bin": (zipfile.ZIP_DEFLATED, bytes(48 << 20)),  # inflates about 1000:1
    "empty.py": (zipfile.ZIP_DEFLATED, b""),
    "text.py": (zipfile.ZIP_DEFLATED, b"".join(b"line %d of a module\n" % i for i in range(200_000))),
    "other.bz2": (zipfile.ZIP_BZIP2, b"compressed another way\n" * 500),
}


def write_archive(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, (method, data) in MEMBERS.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method, compresslevel=9)
        with archive.open(zipfile.ZipInfo("zip64.bin"), "w", force_zip64=True) as member:
            member.write(b"large-file form\n" * 4096)
    return path


def read_all(path: Path, name: str, size: int) -> bytes:
    with zipfile.ZipFile(path) as archive, path.open("rb") as handle:
        with open_member(archive, handle.fileno(), name) as stream:
            parts = []
            while chunk := stream.read(size):
                parts.append(chunk)
            return b"".join(parts)


@pytest.mark.parametrize("size", [1 << 20, 7, -1])
def test_every_member_reads_as_zipfile_reads_it(tmp_path, size):
    path = write_archive(tmp_path / "a.whl")
    with zipfile.ZipFile(path) as archive:
        expected = {info.filename: archive.read(info) for info in archive.infolist()}
    names = [name for name in expected if size > 1000 or len(expected[name]) < 1 << 20]
    for name in names:
        assert read_all(path, name, size) == expected[name], name


def test_read_gives_exactly_the_size_asked_until_the_end(tmp_path):
    """tarfile's copy asks for a fixed size and fails on a short read before the member's end."""
    path = write_archive(tmp_path / "a.whl")
    with zipfile.ZipFile(path) as archive, path.open("rb") as handle:
        with open_member(archive, handle.fileno(), "zeros.bin") as stream:
            sizes = [len(stream.read(1 << 20)) for _ in range(49)]
    assert sizes == [1 << 20] * 48 + [0]


def flip_byte_inside(path: Path, name: str) -> None:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    with path.open("r+b") as handle:
        handle.seek(info.header_offset + 30 + len(name.encode()) + len(info.extra) + info.compress_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("name", ["stored.txt", "text.py"])
def test_a_damaged_member_is_refused(tmp_path, name):
    path = write_archive(tmp_path / "a.whl")
    flip_byte_inside(path, name)
    with pytest.raises(BuildFailure, match=rf"^{name}: (bad CRC-32|not a valid deflate stream).*damaged"):
        read_all(path, name, 1 << 20)


def test_a_member_whose_local_header_is_not_where_the_directory_says_is_refused(tmp_path):
    path = write_archive(tmp_path / "a.whl")
    with zipfile.ZipFile(path) as archive:
        offset = archive.getinfo("text.py").header_offset
    with path.open("r+b") as handle:
        handle.seek(offset)
        handle.write(b"XXXX")
    with pytest.raises(BuildFailure, match=r"^text.py: no local header where the archive's directory places it$"):
        read_all(path, "text.py", 1 << 20)
