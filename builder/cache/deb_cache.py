"""Locked .deb files on the host, keyed by content, beside the locked wheels.

Each package a lock entry's system packages name is downloaded once from the archive the lock
records (its mirror, and when the mirror no longer serves that version, the snapshot archive's copy
of the state the lock was made from), checked against the lock's size and sha256, and stored as
<cache>/locked-debs/sha256/<hex>/<file name>. A file is renamed into place only after its hash
matched; before each use it is hashed again (or its record says it was, cache/content_check.py), and
one that no longer matches is removed and fetched again. A build gets a flat directory of hard
links to exactly those files: `builder base` makes its local repository from it, and a registry
row's install step mounts it read-only.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from builder import paths
from builder.cache import content_check
from builder.engine.host_network import ca_bundle
from builder.errors import BuildFailure, UserError
from builder.files import link_or_copy
from builder.lock import validate
from builder.lock.debian_archive import mirror_for
from builder.lock.system_packages import DebPackage, SystemPackages

_TIMEOUT_S = 60
_CHUNK = 1 << 20
# One file at a time, each on a new connection, the base's 151 .debs took 26 s of a cold `builder base`
# with the CPU idle: here eleven of the name lookups a new connection makes took 5 s each. A few
# downloads at once, each worker keeping its connections open, share the link and look a host up once.
_PARALLEL_DOWNLOADS = 8


def default_root() -> Path:
    return paths.cache_root() / "locked-debs"


@dataclass(frozen=True)
class DebFillReport:
    wanted: int
    downloaded: int
    downloaded_bytes: int
    from_snapshot: int  # of those, fetched from the snapshot archive


class DebCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def path(self, package: DebPackage) -> Path:
        """Where the .deb lives; the lock's values are checked when it is read, and again here."""
        if not validate.HEX64.fullmatch(package.sha256) or not validate.DEB_FILE.fullmatch(package.basename):
            raise UserError(f"{package.pin}: the lock's sha256 or .deb file name cannot name a cache file")
        return self.root / "sha256" / package.sha256 / package.basename

    def missing(self, locked: SystemPackages) -> list[DebPackage]:
        """The .debs not here as their sha256 says: absent, or present with other content (removed)."""
        return [package for package in locked.packages
                if not content_check.holds(self.path(package), package.sha256, package.size)]

    def require(self, locked: SystemPackages, what: str) -> None:
        """--offline: every .deb must already be here; one line naming what is not."""
        absent = self.missing(locked)
        if absent:
            names = content_check.first_pins([p.pin for p in absent])
            raise UserError(f"{what}: offline, and the .deb cache {self.root} lacks {len(absent)} of "
                            f"{len(locked.packages)} locked packages ({names}): run `builder fetch` where the "
                            f"archive is reachable and bring the cache")

    def fill(self, locked: SystemPackages, what: str, sources: Callable[[], tuple[str, ...]] = tuple) -> DebFillReport:
        """Download every missing .deb once, a few at a time: from the mirror `sources()` names for its
        archive (apt's configuration where the fetch runs: the lock names no mirror), else the archive's
        snapshot. Every download runs to its end; the first failure, in the lock's order, is raised."""
        absent = self.missing(locked)
        lines = sources() if absent else ()
        wanted = [(package, self._urls(locked, package, lines, what)) for package in absent]
        with ThreadPoolExecutor(_PARALLEL_DOWNLOADS, thread_name_prefix="deb-download") as pool:
            futures = [pool.submit(self._store, package, urls, what) for package, urls in wanted]
        positions = [future.result() for future in futures]
        from_snapshot = sum(bool(locked.archive_of(package).snapshot) and position == len(urls) - 1
                            for (package, urls), position in zip(wanted, positions))
        return DebFillReport(len(locked.packages), len(absent), sum(package.size for package in absent),
                             from_snapshot)

    @staticmethod
    def _urls(locked: SystemPackages, package: DebPackage, lines: tuple[str, ...], what: str) -> list[str]:
        """Where `package` may be fetched, in order: its archive's mirror, then its snapshot."""
        archive = locked.archive_of(package)
        mirror = mirror_for(archive, lines)
        urls = [f"{mirror}/{package.filename}"] if mirror else []
        if archive.snapshot:
            urls.append(f"{archive.snapshot}/{package.filename}")
        if not urls:
            raise UserError(f"{what}: no apt source serves {archive.name} {archive.suite}, and it has no "
                            f"snapshot archive: name one in the matrix's `sources`")
        return urls

    def _store(self, package: DebPackage, urls: list[str], what: str) -> int:
        """Store the first of `urls` that answers; returns its position. A file that is not the lock's is
        refused at once: a mirror serving other bytes under a locked name is no reason to look elsewhere."""
        staging = self.root / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        failures = []
        for position, url in enumerate(urls):
            with tempfile.NamedTemporaryFile(dir=staging, delete=False) as handle:
                partial = Path(handle.name)
                try:
                    sha256, size = _download(url, handle)
                except (requests.RequestException, OSError) as error:
                    failures.append(f"{url}: {_reason(error)}")
                    partial.unlink(missing_ok=True)
                    continue
            if sha256 != package.sha256 or size != package.size:
                partial.unlink(missing_ok=True)
                raise BuildFailure(f"{what}: {url} is not the locked {package.pin} (sha256 {sha256[:16]}..., "
                                   f"{size} bytes; the lock says {package.sha256[:16]}..., {package.size} "
                                   f"bytes): refused")
            target = self.path(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, target)
            content_check.record_checked(target, package.sha256)
            return position
        raise BuildFailure(f"{what}: {package.pin} could not be fetched: {'; '.join(failures)}")

    def link_into(self, locked: SystemPackages, directory: Path) -> None:
        """A flat directory with exactly these .debs: hard links, a copy only across filesystems."""
        directory.mkdir(parents=True, exist_ok=True)
        for package in locked.packages:
            if not content_check.holds(self.path(package), package.sha256, package.size):
                raise BuildFailure(f"{package.pin}: the cached .deb is not the locked file; run the build again to "
                                   "fetch it")
            link_or_copy(self.path(package), directory / package.basename)


_SESSIONS = threading.local()


def _session() -> requests.Session:
    """This thread's session: its connections stay open from one file to the next."""
    session = getattr(_SESSIONS, "session", None)
    if session is None:
        session = _SESSIONS.session = requests.Session()
        bundle = ca_bundle()
        session.verify = str(bundle) if bundle is not None else True
    return session


def _download(url: str, handle) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with _session().get(url, stream=True, timeout=_TIMEOUT_S) as response:
        response.raise_for_status()
        for chunk in response.iter_content(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            handle.write(chunk)
    return digest.hexdigest(), size


def _reason(error: Exception) -> str:
    """The HTTP status where the server answered, else what stopped the connection."""
    response = getattr(error, "response", None)
    return str(response.status_code) if response is not None else str(error)
