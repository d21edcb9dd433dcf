"""Locked wheels on the host, keyed by content, so a build installs them with no index at all.

Each wheel a lock entry names (file name + sha256) is downloaded once, by pip (which knows its own
default index and honours the entry's extra indexes and direct URLs), checked against the lock's
sha256, and stored as <root>/sha256/<hex>/<file name>. A file is renamed into place only after its
hash matched; before each use it is hashed again (or its record says it was, cache/content_check.py),
and one that no longer matches is removed and fetched again. A build gets a flat directory of
hard links to exactly its entry's wheels, bind-mounted read-only into the install steps, where pip
checks every hash again (--require-hashes) before installing.

An air-gapped host fills the cache elsewhere (`builder fetch`), carries the directory over, and
builds with `--offline`.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from builder import paths
from builder.cache import content_check
from builder.engine import host_network
from builder.errors import BuildFailure, UserError
from builder.files import link_or_copy, sha256_file
from builder.lock import validate
from builder.lock.model import DEFAULT_INDEX, Resolution

# A plain file name: the lock reader checks the full PEP 427 grammar; this keeps a path in its folder.
_PLAIN_WHEEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    filename: str
    sha256: str
    source: str  # DEFAULT_INDEX, an extra index URL, or the wheel's own URL
    url: str | None = None

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def requirement(self) -> str:
        """What pip downloads: the exact file, since a single --hash admits no other."""
        spec = f"{self.name} @ {self.url}" if self.url else self.pin
        return f"{spec} --hash=sha256:{self.sha256}"


def locked_wheels(resolution: Resolution) -> tuple[LockedWheel, ...]:
    """The one file per distribution the resolution chose for the target, sorted by name."""
    return tuple(LockedWheel(d.name, d.version, d.wheel, d.sha256, d.source, d.url)
                 for d in sorted(resolution.distributions, key=lambda d: d.name))


@dataclass(frozen=True)
class FillReport:
    wanted: int
    downloaded: int  # wheels fetched by this run
    downloaded_bytes: int


# pip runs at once when filling the cache (_download_in_parts).
_PARALLEL_DOWNLOADS = 4


def default_root() -> Path:
    return paths.cache_root() / "locked-wheels"


class WheelCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def path(self, wheel: LockedWheel) -> Path:
        """Where the wheel lives; the lock's values are checked when it is read, and again here, since
        they become a path."""
        if not validate.HEX64.fullmatch(wheel.sha256) or not _PLAIN_WHEEL.fullmatch(wheel.filename):
            raise UserError(f"{wheel.pin}: the lock's sha256 or wheel file name cannot name a cache file")
        return self.root / "sha256" / wheel.sha256 / wheel.filename

    def missing(self, wheels: tuple[LockedWheel, ...]) -> list[LockedWheel]:
        """The wheels not here as their sha256 says: absent, or present with other content (removed)."""
        return [wheel for wheel in wheels if not content_check.holds(self.path(wheel), wheel.sha256)]

    def checked_digest(self, path: Path) -> str:
        """The sha256 of a cached wheel: its key, where its record says the file still hashes to it
        (content_check.py), so a wheel the fetch has just checked is not read again to plan it."""
        key = path.parent.name
        if path.parent.parent != self.root / "sha256":
            return sha256_file(path)
        return key if content_check.holds(path, key) else "another file's (removed from the cache)"

    def require(self, wheels: tuple[LockedWheel, ...], what: str) -> None:
        """--offline: every wheel must already be here; one line naming what is not."""
        absent = self.missing(wheels)
        if absent:
            names = content_check.first_pins([wheel.pin for wheel in absent])
            raise UserError(f"{what}: offline, and the wheel cache {self.root} lacks {len(absent)} of "
                            f"{len(wheels)} locked wheels ({names}): run `builder fetch` where the indexes "
                            f"are reachable and bring the cache")

    def fill(self, wheels: tuple[LockedWheel, ...], python: str, what: str) -> FillReport:
        """Download every missing wheel once, in a few pip runs at a time; when one fails, each wheel
        still missing is tried alone, so the cache keeps every file that matched the lock and the
        failure is one line naming exactly the wheels that did not arrive."""
        absent = self.missing(wheels)
        if not absent:
            return FillReport(len(wheels), 0, 0)
        stored, failure = self._download_in_parts(absent, python)
        reasons = {}
        if failure:
            for wheel in [w for w in absent if w not in stored]:
                alone, reason = self._download([wheel], python)
                stored |= alone
                if reason:
                    reasons[wheel] = reason
        if reasons:
            names = ", ".join(wheel.pin for wheel in list(reasons)[:8]) + (", ..." if len(reasons) > 8 else "")
            raise BuildFailure(f"{what}: {len(reasons)} locked wheels could not be fetched ({names}): "
                               f"{next(iter(reasons.values()))}")
        return FillReport(len(wheels), len(stored), sum(self.path(wheel).stat().st_size for wheel in stored))

    def _download_in_parts(self, wheels: list[LockedWheel], python: str) -> tuple[set[LockedWheel], str]:
        """pip fetches one file at a time and asks the index once per project, so a single run spends
        most of its time waiting: the wheels are dealt round-robin to a few runs at once (169 wheels,
        5.2 GB: 16 s instead of 38 s). Returns what was stored and the first failure ('' if none)."""
        parts = [wheels[start::_PARALLEL_DOWNLOADS] for start in range(min(_PARALLEL_DOWNLOADS, len(wheels)))]
        with ThreadPoolExecutor(len(parts), thread_name_prefix="pip-download") as pool:
            results = list(pool.map(lambda part: self._download(part, python), parts))
        stored = set().union(*(part_stored for part_stored, _ in results))
        return stored, next((failure for _, failure in results if failure), "")

    def _download(self, wheels: list[LockedWheel], python: str) -> tuple[set[LockedWheel], str]:
        staging_parent = self.root / "staging"
        staging_parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=staging_parent) as staging:
            failure = _pip_download(wheels, python, Path(staging))
            return self._store_matching(wheels, Path(staging)), failure

    def _store_matching(self, wanted: list[LockedWheel], staging: Path) -> set[LockedWheel]:
        by_sha = {wheel.sha256: wheel for wheel in wanted}
        stored = set()
        for downloaded in sorted(staging.glob("*.whl")):
            wheel = by_sha.get(sha256_file(downloaded))
            if wheel is None or downloaded.name != wheel.filename:
                continue  # pip checked hashes too; anything else is not the lock's file
            target = self.path(wheel)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(downloaded, target)
            content_check.record_checked(target, wheel.sha256)
            stored.add(wheel)
        return stored

    def link_into(self, wheels: tuple[LockedWheel, ...], directory: Path) -> None:
        """A flat directory with exactly these wheels (pip's --find-links does not recurse): hard
        links, so no gigabytes are copied; a copy only where the cache is on another filesystem."""
        directory.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            if not content_check.holds(self.path(wheel), wheel.sha256):
                raise BuildFailure(f"{wheel.pin}: the cached wheel is not the locked file; run the build again to "
                                   "fetch it")
            link_or_copy(self.path(wheel), directory / wheel.filename)


def _platform_options(wheels: list[LockedWheel]) -> list[str]:
    """pip download for the image, not this host: every platform tag the locked files carry (pip
    does not widen manylinux_2_28 to the older tags a wheel may be published under)."""
    platforms = sorted({tag.platform for wheel in wheels for tag in parse_wheel_filename(wheel.filename)[3]}
                       - {"any"})
    options = ["--only-binary=:all:", "--implementation", "cp"]  # the images run CPython
    for platform in platforms:
        options += ["--platform", platform]
    return options


def _pip_download(wheels: list[LockedWheel], python: str, staging: Path) -> str:
    """Run one pip download for all of them; '' when it succeeded, else pip's last error line."""
    requirements = staging / "requirements.txt"
    indexes = sorted({wheel.source for wheel in wheels if not wheel.url and wheel.source != DEFAULT_INDEX})
    lines = [f"--extra-index-url {index}" for index in indexes] + [wheel.requirement() for wheel in wheels]
    requirements.write_text("\n".join(lines) + "\n")
    # --no-cache-dir: pip's own HTTP cache would be a second copy of every wheel; this cache is the one.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--disable-pip-version-check",
               "--no-cache-dir", "--no-input", "--progress-bar", "off", "--dest", str(staging), *_platform_options(wheels),
               "--python-version", python, "-r", str(requirements)]
    bundle = host_network.ca_bundle()
    if bundle is not None:
        command += ["--cert", str(bundle)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    with contextlib.suppress(FileNotFoundError):
        requirements.unlink()
    if result.returncode == 0:
        return ""
    output = result.stderr or result.stdout
    if "DO NOT MATCH THE HASHES" in output:
        return "the file served is not the one the lock names (sha256 differs); pip refused it"
    errors = [" ".join(line.split()) for line in output.splitlines() if "ERROR" in line]
    return errors[-1] if errors else f"pip download exit status {result.returncode}"
