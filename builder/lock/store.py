"""matrix.lock on disk: reading (older schemas migrated in memory), and writing under a lock.

Every change is a read-modify-write under an exclusive flock on a sidecar file (two writers both
land), and the file is replaced atomically (temp file, fsync, rename): a crash leaves the old lock.
JSON with sorted keys and no wall-clock times, so the same facts give the same bytes. A file of an
earlier schema is read as the current one and rewritten in the current schema by the first write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from builder.errors import UserError, one_line
from builder.files import TEMP_SUFFIX, write_atomic
from builder.lock import validate
from builder.lock.migrate import MIGRATIONS
from builder.lock.model import LockEntry

SCHEMA = 2
FILE_NAME = "matrix.lock"


@dataclass
class LockFile:
    """The whole lock: one entry per stack row. Entries are frozen; a change replaces one."""

    stacks: dict[str, LockEntry] = field(default_factory=dict)
    schema_read: int = SCHEMA  # the schema the file was in when read

    def get(self, name: str) -> LockEntry | None:
        return self.stacks.get(name)

    def require(self, name: str) -> LockEntry:
        found = self.stacks.get(name)
        if found is None:
            raise UserError(f"{name} is not in matrix.lock: run `builder lock --stack {name}` first")
        return found

    def put(self, found: LockEntry) -> None:
        self.stacks[found.name] = found

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "stacks": {name: e.to_dict() for name, e in sorted(self.stacks.items())}}


def parse(text: str, path: Path) -> LockFile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA and schema not in MIGRATIONS:
        raise UserError(f"{path}: unsupported lock schema {schema!r} (this builder reads 1 and {SCHEMA})")
    read_entry = LockEntry.from_dict if schema == SCHEMA else MIGRATIONS[schema]
    try:
        stacks = {name: read_entry(item) for name, item in data["stacks"].items()}
        problems = [f"{one_line(str(name))}: {problem}" for name, entry in stacks.items()
                    for problem in validate.problems(name, data["stacks"][name], entry)]
        if schema == SCHEMA:
            problems += [f"{one_line(str(name))}: distributions_hash is missing" for name, item in data["stacks"].items()
                         if "distributions_hash" not in item["resolution"]]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UserError(f"{path}: not a schema-{schema} lock ({type(error).__name__}: {one_line(str(error))})") from None
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UserError(f"{path}: malformed lock, refused: {'; '.join(problems[:3])}{more}")
    return LockFile(stacks, schema)


def read(path: Path) -> LockFile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return LockFile()
    return parse(text, path)


def dumps(lock: LockFile) -> str:
    return json.dumps(lock.to_dict(), indent=2, sort_keys=True) + "\n"


def entry(name: str, path: Path) -> LockEntry | None:
    return read(path).get(name)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    sidecar = path.with_name(path.name + ".lck")
    with open(sidecar, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def update(change: Callable[[LockFile], object], path: Path) -> LockFile:
    """Apply `change` to the lock and write the result, holding the writers' lock throughout. When
    `change` raises, nothing is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        _remove_stale_temporaries(path)
        lock = read(path)
        change(lock)
        text = dumps(lock)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            write_atomic(path, text)
    return lock


def _remove_stale_temporaries(path: Path) -> None:
    """Left by a writer that died before its rename; no writer is active while we hold the lock."""
    for leftover in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
