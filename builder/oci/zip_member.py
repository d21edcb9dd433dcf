"""A wheel's member read for a layer: its deflate stream inflated by ISA-L (python-isal) rather than
zlib. The bytes are the same (inflating is deterministic); ISA-L takes about half the time, and
inflating is most of what writing a wheel group's layer costs (docs/write-once.md).

zipfile still reads the archive: its central directory says where each member lies, how big it is
and its CRC-32 (ZIP64 included). Only the member's own bytes are read here, with pread, so readers of
one archive share no file position. As zipfile does, a member whose CRC-32 differs is refused.
Members neither stored nor deflated, or encrypted, are read by zipfile itself.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import BinaryIO

from isal import isal_zlib

from builder.errors import BuildFailure

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra field's lengths
_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1
_CHUNK = 1 << 20


def open_member(archive: zipfile.ZipFile, descriptor: int, name: str) -> BinaryIO:
    """A read-only stream of member `name`'s content; `descriptor` is the archive's open file."""
    info = archive.getinfo(name)
    if info.flag_bits & _ENCRYPTED or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return archive.open(info)
    return _MemberReader(descriptor, info, _data_offset(descriptor, info))


def _data_offset(descriptor: int, info: zipfile.ZipInfo) -> int:
    header = os.pread(descriptor, _LOCAL_HEADER.size, info.header_offset)
    if len(header) != _LOCAL_HEADER.size:
        raise BuildFailure(f"{info.filename}: the archive ends inside its local header")
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    if signature != _SIGNATURE:
        raise BuildFailure(f"{info.filename}: no local header where the archive's directory places it")
    return info.header_offset + _LOCAL_HEADER.size + name_length + extra_length


class _MemberReader:
    """read(n) gives exactly n bytes until the member's end, as tarfile's copy expects."""

    def __init__(self, descriptor: int, info: zipfile.ZipInfo, offset: int) -> None:
        self._descriptor, self._info = descriptor, info
        self._offset, self._raw_left = offset, info.compress_size
        self._left = info.file_size  # bytes still to give
        self._inflater = isal_zlib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        self._pending = b""  # raw bytes read but not yet inflated
        self._crc = 0

    def _raw(self, size: int) -> bytes:
        data = os.pread(self._descriptor, min(size, self._raw_left), self._offset)
        self._offset += len(data)
        self._raw_left -= len(data)
        return data

    def _next(self, size: int) -> bytes:
        """Up to `size` more bytes of content; empty only when the archive has nothing more to give."""
        if self._inflater is None:
            return self._raw(size)
        while True:
            if not self._pending and self._raw_left:
                self._pending = self._raw(_CHUNK)
            try:
                data = self._inflater.decompress(self._pending, size)
            except isal_zlib.error as error:
                raise BuildFailure(f"{self._info.filename}: not a valid deflate stream ({error}): the archive is "
                                   "damaged") from None
            self._pending = self._inflater.unconsumed_tail
            if data or not (self._pending or self._raw_left):
                return data

    def read(self, size: int = -1) -> bytes:
        wanted = self._left if size is None or size < 0 else min(size, self._left)
        parts, got = [], 0
        while got < wanted:
            data = self._next(wanted - got)
            if not data:
                raise BuildFailure(f"{self._info.filename}: the archive ends inside the member")
            parts.append(data)
            got += len(data)
        data = b"".join(parts)
        self._crc = zlib.crc32(data, self._crc)
        self._left -= len(data)
        if self._left == 0 and self._crc != self._info.CRC:
            raise BuildFailure(f"{self._info.filename}: bad CRC-32 (the archive is damaged)")
        return data

    def close(self) -> None:
        self._pending = b""

    def __enter__(self) -> _MemberReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
