"""A wheel on an index read as a zip file through HTTP range requests: its METADATA or file list
costs a few hundred kB, not the whole wheel (torch's is over 500 MB)."""

from __future__ import annotations

import zipfile

import requests

from builder.errors import UserError

_BLOCK = 1 << 18
TIMEOUT_S = 60


class RemoteFile:
    """Just enough of a binary file for zipfile: seek, tell and read, fetched a block at a time."""

    def __init__(self, url: str, size: int, session: requests.Session):
        self.url, self.size, self.session = url, size, session
        self.position = 0
        self.blocks: dict[int, bytes] = {}

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = {0: offset, 1: self.position + offset, 2: self.size + offset}[whence]
        return self.position

    def _block(self, number: int) -> bytes:
        if number not in self.blocks:
            start = number * _BLOCK
            end = min(self.size, start + _BLOCK) - 1
            response = self.session.get(self.url, headers={"Range": f"bytes={start}-{end}"}, timeout=TIMEOUT_S)
            if response.status_code != 206 or len(response.content) != end - start + 1:
                raise UserError(f"{self.url}: the server does not answer range requests (HTTP {response.status_code})")
            self.blocks[number] = response.content
        return self.blocks[number]

    def read(self, count: int = -1) -> bytes:
        end = self.size if count is None or count < 0 else min(self.size, self.position + count)
        out = bytearray()
        while self.position < end:
            number, offset = divmod(self.position, _BLOCK)
            chunk = self._block(number)[offset: offset + end - self.position]
            out += chunk
            self.position += len(chunk)
        return bytes(out)


def open_wheel(url: str, size: int, session: requests.Session) -> zipfile.ZipFile:
    return zipfile.ZipFile(RemoteFile(url, size, session))  # type: ignore[arg-type]


def metadata(url: str, size: int, session: requests.Session) -> str:
    """The wheel's .dist-info/METADATA text."""
    with open_wheel(url, size, session) as wheel:
        names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise UserError(f"{url}: no single .dist-info/METADATA in the wheel")
        return wheel.read(names[0]).decode("utf-8")
