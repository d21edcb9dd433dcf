"""Is there a release on pip's default index newer than every stack's pin of a package? (bump.yml)

Each look-up's answer (the newest final release, and when it was asked) is kept in the builder's cache
(<cache root>/bump-newer.json), so `builder status` can say what upstream had without the network.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.bump.index import Index
from builder.config.matrix import Matrix
from builder.errors import UserError
from builder.files import write_atomic
from builder.paths import cache_root

CACHE_SCHEMA = 1


@dataclass(frozen=True)
class KnownRelease:
    """What the last look-up of a package found."""

    package: str  # canonical name
    newest: str  # the newest final release on pip's default index
    checked: str  # when it was asked: UTC, ISO 8601 to the second

    @property
    def version(self) -> Version:
        return Version(self.newest)


def cache_path() -> Path:
    return cache_root() / "bump-newer.json"


def known_releases(path: Path | None = None) -> dict[str, KnownRelease]:
    """The remembered look-ups by package; none when nothing was looked up here. A cache that cannot be
    read is as good as none: the next look-up writes it again."""
    path = path or cache_path()
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("schema") != CACHE_SCHEMA:
            return {}
        found = {}
        for name, item in document["packages"].items():
            Version(item["newest"])  # a version that does not parse makes the whole cache unreadable
            found[name] = KnownRelease(name, item["newest"], str(item["checked"]))
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidVersion):
        return {}


def _remember(release: KnownRelease, path: Path | None = None) -> None:
    path = path or cache_path()
    known = known_releases(path)
    known[release.package] = release
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"schema": CACHE_SCHEMA,
                "packages": {name: {k: v for k, v in asdict(r).items() if k != "package"}
                             for name, r in sorted(known.items())}}
    write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def newest_release(package: str, index: Index | None = None) -> str | None:
    """The newest final release of `package` on the index (None: it has no final release), remembered."""
    package = canonicalize_name(package)
    project = (index or Index()).project(package)
    if project is None:
        raise UserError(f"unknown package {package}: pip's default index has no such project")
    releases = [v for v in project.versions() if not v.is_prerelease and not v.is_devrelease]
    if not releases:
        return None
    newest = str(releases[-1])
    _remember(KnownRelease(package, newest, datetime.now(timezone.utc).isoformat(timespec="seconds")))
    return newest


def newest_beyond_stacks(matrix: Matrix, package: str, index: Index | None = None) -> tuple[str, str] | None:
    """(newest final release, the stack pinning the highest version) when the index's newest is newer
    than every stack's pin, else None."""
    package = canonicalize_name(package)
    pinned = [(row.package(package).parsed_version, row.family) for row in matrix.registry_stacks
              if row.package(package)]
    if not pinned:
        raise UserError(f"no stack pins {package}")
    newest = newest_release(package, index)
    highest, family = max(pinned)
    if newest is None or Version(newest) <= Version(highest.public):
        return None
    return newest, family
