"""A row's locked system packages as frozen values: what `builder lock` records in the resolution
(builder/lock/debian_archive.py resolves them from the archive's signed index) and what
`builder fetch`, `builder base` and a registry row's build read back (Resolution.system_packages).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass


def archive_name(uri: str) -> str:
    """The archive a source's URI serves, as its last path part: debian, debian-security, ubuntu. The
    snapshot archives are laid out by that name too."""
    return urllib.parse.urlsplit(uri).path.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DebArchive:
    """One apt source as it was when locked, named by the archive and its signed state, not by the
    mirror that served it: which mirror to fetch from is apt's configuration where the fetch runs (the
    matrix's `sources`, else mmdebstrap's defaults), and a lock made behind an internal mirror names none."""

    name: str  # archive_name() of the source's URI
    suite: str
    components: tuple[str, ...]
    date: str  # InRelease's Date field, verbatim
    snapshot: str  # the snapshot archive's URL of this state ("" where the distribution has none)
    in_release: str = ""  # sha256 of the verified InRelease; "" in entries locked before it was recorded

    def source_line(self, uri: str) -> str:
        return f"deb {uri} {self.suite} {' '.join(self.components)}"

    def to_dict(self) -> dict:
        return {"name": self.name, "suite": self.suite, "components": list(self.components), "date": self.date,
                "snapshot": self.snapshot, "in_release": self.in_release}

    @classmethod
    def from_dict(cls, data: dict) -> "DebArchive":
        # Locks written before the archive was named recorded the mirror's URI: its name is read from it.
        name = data["name"] if "name" in data else archive_name(data["uri"])
        return cls(name, data["suite"], tuple(data["components"]), data["date"], data["snapshot"],
                   data.get("in_release", ""))


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    filename: str  # the pool path, relative to the archive's URI (Packages' Filename)
    size: int
    sha256: str
    archive: int  # index into SystemPackages.archives

    @property
    def basename(self) -> str:
        return self.filename.rsplit("/", 1)[-1]

    @property
    def pin(self) -> str:
        return f"{self.name}={self.version}"

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "architecture": self.architecture,
                "filename": self.filename, "size": self.size, "sha256": self.sha256, "archive": self.archive}

    @classmethod
    def from_dict(cls, data: dict) -> "DebPackage":
        return cls(data["name"], data["version"], data["architecture"], data["filename"], int(data["size"]),
                   data["sha256"], int(data["archive"]))


@dataclass(frozen=True)
class SystemPackages:
    """A row's locked system packages: the local base's whole root (scope "root"), or what a row adds
    to a registry base (scope "added")."""

    distribution: str
    architecture: str
    scope: str  # "root" | "added"
    requested: tuple[str, ...]
    archives: tuple[DebArchive, ...]
    packages: tuple[DebPackage, ...]  # sorted by name

    def archive_of(self, package: DebPackage) -> DebArchive:
        return self.archives[package.archive]

    def versions(self) -> dict[str, str]:
        return {package.name: package.version for package in self.packages}

    def to_dict(self) -> dict:
        return {"distribution": self.distribution, "architecture": self.architecture, "scope": self.scope,
                "requested": list(self.requested), "archives": [a.to_dict() for a in self.archives],
                "packages": [p.to_dict() for p in self.packages]}

    @classmethod
    def from_dict(cls, data: dict) -> "SystemPackages":
        return cls(data["distribution"], data["architecture"], data["scope"], tuple(data["requested"]),
                   tuple(DebArchive.from_dict(a) for a in data["archives"]),
                   tuple(DebPackage.from_dict(p) for p in data["packages"]))


def version_changes(old: SystemPackages | None, new: SystemPackages) -> list[str]:
    """'name OLD -> NEW' (or added/removed) for every package that moved, sorted by name."""
    before, after = (old.versions() if old else {}), new.versions()
    lines = []
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) != after.get(name):
            lines.append(f"{name} {before.get(name, '(none)')} -> {after.get(name, '(none)')}")
    return lines
