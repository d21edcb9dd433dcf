"""Line numbers for keys of a TOML document.

tomllib reports positions only for syntax errors, but a validation message is
only useful with the line it is about. This scanner maps each key path (as
tomllib's nested dicts and lists address it) to the line that defines it,
covering what matrix files use: tables, arrays of tables, dotted keys and
one-line inline tables.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r'^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\'))*)\s*=')
_INLINE_KEY = re.compile(r'[{,]\s*((?:[A-Za-z0-9_-]+|"[^"]*")(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"))*)\s*=')

Path = tuple


def _split_key(text: str) -> list[str]:
    return [a or b or c for a, b, c in re.findall(r'"([^"]*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)', text)]


class Positions:
    """Key path -> line number (1-based) for one TOML text."""

    def __init__(self, text: str):
        self._lines: dict[Path, int] = {}
        array_counts: dict[Path, int] = {}
        current: Path = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header and not line.lstrip().startswith("#"):
                keys = _split_key(header.group(2))
                if header.group(1) == "[[":
                    # The array itself is not indexed: this header adds its next element.
                    parent = self._resolve(keys[:-1], array_counts) + (keys[-1],)
                    index = array_counts.get(parent, -1) + 1
                    array_counts[parent] = index
                    current = parent + (index,)
                else:
                    current = self._resolve(keys, array_counts)
                self._lines.setdefault(current, number)
                continue
            key = _KEY.match(line)
            if not key:
                continue
            path = current + tuple(_split_key(key.group(1)))
            self._record_prefixes(path, number)
            value = line[key.end():]
            for inline in _INLINE_KEY.finditer(value):
                self._lines.setdefault(path + tuple(_split_key(inline.group(1))), number)

    def _record_prefixes(self, path: Path, number: int) -> None:
        for end in range(1, len(path) + 1):
            self._lines.setdefault(path[:end], number)

    @staticmethod
    def _resolve(keys: list[str], array_counts: dict[Path, int]) -> Path:
        """Insert array-of-tables indices: [stack.serve] under [[stack]] is ("stack", n, "serve")."""
        path: Path = ()
        for key in keys:
            path = path + (key,)
            if path in array_counts:
                path = path + (array_counts[path],)
        return path

    def defines(self, path: Path) -> bool:
        return tuple(path) in self._lines

    def line(self, path: Path) -> int | None:
        """The line defining `path`, or its closest defined ancestor."""
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None
