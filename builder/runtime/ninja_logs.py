"""ninja's build and deps logs rewritten so a baked module's files are the same bytes on every build.

ninja records, per output, when its command ran and the output's mtime (.ninja_log), and, per output,
its discovered dependencies with the output's mtime (.ninja_deps), in the order jobs finished. Both
are needed at run time: without an entry ninja rebuilds the output. What it checks is the command's
hash and that the recorded mtime is not older than the files' own, so the rewrite keeps each output's
last entry, its hash and its dependencies, sets the times to one value (the build's
SOURCE_DATE_EPOCH, the mtime every file in the image has), and writes the entries sorted by path, as
ninja's own recompaction would lay them out.

Standard library only (runs inside the image).
"""

from __future__ import annotations

import struct
from pathlib import Path

BUILD_LOG = ".ninja_log"
DEPS_LOG = ".ninja_deps"
_BUILD_HEADER = "# ninja log v"
_DEPS_HEADER = b"# ninjadeps\n"
_DEPS_VERSION = 4
_DEPS_BIT = 0x80000000


def normalise_build_log(text: str, mtime_ns: int) -> str:
    lines = text.splitlines()
    if not lines or not lines[0].startswith(_BUILD_HEADER) or lines[0][len(_BUILD_HEADER):] not in ("5", "6", "7"):
        raise ValueError(f"not a ninja build log of version 5 to 7: {lines[0] if lines else 'empty'!r}")
    last: dict[str, str] = {}
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != 5:
            raise ValueError(f"not a ninja build log entry: {line!r}")
        last[fields[3]] = fields[4]
    entries = [f"0\t0\t{mtime_ns}\t{path}\t{command_hash}\n" for path, command_hash in sorted(last.items())]
    return lines[0] + "\n" + "".join(entries)


def _read_deps(data: bytes) -> tuple[list[str], dict[int, list[int]]]:
    if not data.startswith(_DEPS_HEADER):
        raise ValueError("not a ninja deps log")
    offset = len(_DEPS_HEADER)
    (version,) = struct.unpack_from("<i", data, offset)
    if version != _DEPS_VERSION:
        raise ValueError(f"ninja deps log version {version}, not {_DEPS_VERSION}")
    offset += 4
    paths: list[str] = []
    deps: dict[int, list[int]] = {}
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        is_deps, size = bool(size & _DEPS_BIT), size & ~_DEPS_BIT
        payload = data[offset:offset + size]
        if len(payload) != size:
            raise ValueError("ninja deps log ends inside a record")
        offset += size
        if is_deps:
            output, _low, _high, *inputs = struct.unpack(f"<iII{(size - 12) // 4}i", payload)
            deps[output] = inputs
        else:
            (checksum,) = struct.unpack_from("<I", payload, size - 4)
            if checksum != (~len(paths)) & 0xFFFFFFFF:
                raise ValueError("ninja deps log path record has a wrong checksum")
            paths.append(payload[:size - 4].rstrip(b"\0").decode("utf-8", "surrogateescape"))
    return paths, deps


def normalise_deps_log(data: bytes, mtime_ns: int) -> bytes:
    paths, deps = _read_deps(data)
    out = bytearray(_DEPS_HEADER + struct.pack("<i", _DEPS_VERSION))
    ids: dict[str, int] = {}

    def path_id(path: str) -> int:
        if path not in ids:
            ids[path] = len(ids)
            name = path.encode("utf-8", "surrogateescape")
            name += b"\0" * (-len(name) % 4)
            out.extend(struct.pack("<I", len(name) + 4) + name + struct.pack("<I", (~ids[path]) & 0xFFFFFFFF))
        return ids[path]

    for output in sorted(deps, key=lambda number: paths[number]):
        inputs = [path_id(paths[number]) for number in deps[output]]
        record = struct.pack(f"<iII{len(inputs)}i", path_id(paths[output]), mtime_ns & 0xFFFFFFFF, mtime_ns >> 32,
                             *inputs)
        out.extend(struct.pack("<I", len(record) | _DEPS_BIT) + record)
    return bytes(out)


def normalise_tree(root: Path, mtime_ns: int) -> list[Path]:
    """Every ninja log under `root` rewritten in place; the files rewritten."""
    done = []
    for path in sorted(root.rglob(BUILD_LOG)):
        path.write_text(normalise_build_log(path.read_text(), mtime_ns))
        done.append(path)
    for path in sorted(root.rglob(DEPS_LOG)):
        path.write_bytes(normalise_deps_log(path.read_bytes(), mtime_ns))
        done.append(path)
    return done
