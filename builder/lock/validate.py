"""Every lock value that becomes a path, a URL, a requirement line or a FROM line, checked when the
lock is read: a hand-edited or hostile matrix.lock is refused before any of it is used.

- sha256 values are 64 lowercase hex characters; digests are `sha256:` and those;
- a wheel's file name is a plain PEP 427 name of its own distribution; a .deb's is a plain
  name_version_arch.deb under a relative pool path with no '..';
- sources are https URLs (plain http only to loopback; an apt archive, signed, as apt's defaults
  are) with no user or password;
- build record paths have plain parts and no '..';
- the stored distributions_hash is the one its distributions give.

`problems(name, raw, entry)` returns one short phrase per bad value; the store joins them into the
one line it refuses the lock with.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from builder.config import grammar
from builder.config.stack import GROUP_ORDER
from builder.errors import one_line
from builder.lock.model import DEFAULT_INDEX, LockEntry

HEX64 = re.compile(r"[0-9a-f]{64}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Debian's pool file name: package_version_architecture.deb (the epoch is not part of it).
DEB_FILE = re.compile(r"[a-z0-9][a-z0-9+.-]+_[A-Za-z0-9.+~-]+_[a-z0-9-]+\.deb")
DEB_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
_POOL_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_-]*")
_ARCHIVE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")  # the last path part of an archive's URI: debian-security
_RECORD_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_TAG = re.compile(r"[A-Za-z0-9._/:-]+")


def _hex(value, what: str) -> list[str]:
    return [] if isinstance(value, str) and HEX64.fullmatch(value) else [f"{what} is not 64 lowercase hex characters"]


def _digest(value, what: str, optional: bool = True) -> list[str]:
    if value is None and optional:
        return []
    return [] if isinstance(value, str) and DIGEST.fullmatch(value) else [f"{what} is not sha256:<64 lowercase hex>"]


def _url(value, what: str, signed_archive: bool = False) -> list[str]:
    problem = grammar.url_problem(value, signed_archive=signed_archive) if isinstance(value, str) else "is not a string"
    return [f"{what} {problem}"] if problem else []


def _wheel(distribution) -> list[str]:
    what = f"distributions.{distribution.name}.wheel"
    name = distribution.wheel
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        return [f"{what} is not a plain file name"]
    try:
        wheel_name, _, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return [f"{what} '{one_line(name)}' is not a wheel file name (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)"]
    if wheel_name != canonicalize_name(distribution.name):
        return [f"{what} is the wheel of {wheel_name}, not of {distribution.name}"]
    return []


def _relative_file(value, what: str, part: re.Pattern) -> list[str]:
    """A path relative to its root that cannot leave it: plain parts, no '..', not absolute."""
    if not isinstance(value, str) or not value or not all(part.fullmatch(p) for p in PurePosixPath(value).parts) \
            or value.startswith("/") or ".." in PurePosixPath(value).parts:
        return [f"{what} is not a plain relative path inside its root"]
    return []


def _record_path(value, what: str) -> list[str]:
    """A build record's path: relative to the project, or absolute where it was written outside it
    (paths.project_relative), or "" for none; plain parts either way, never '..'."""
    if value == "":
        return []  # none written
    parts = PurePosixPath(value).parts if isinstance(value, str) else ()
    if not parts or not all(_RECORD_PART.fullmatch(p) for p in parts if p != "/") or ".." in parts:
        return [f"{what} is not a plain path with no '..'"]
    return []


def _distributions(resolution) -> list[str]:
    problems = []
    for d in resolution.distributions:
        where = f"distributions.{d.name}"
        if not grammar.PACKAGE.fullmatch(d.name) or canonicalize_name(d.name) != d.name:
            problems.append(f"{where}: the name is not a canonical distribution name")
            continue
        if not isinstance(d.version, str) or not grammar.VERSION.fullmatch(d.version):
            problems.append(f"{where}.version is not a version")
        problems += _hex(d.sha256, f"{where}.sha256")
        problems += [p for h in d.hashes for p in _hex(h, f"{where}.hashes[]")][:1]
        problems += _wheel(d)
        if d.source != DEFAULT_INDEX:
            problems += _url(d.source, f"{where}.source")
        if d.url is not None:
            problems += _url(d.url, f"{where}.url")
        if d.group not in GROUP_ORDER:
            problems.append(f"{where}.group is not one of {', '.join(GROUP_ORDER)}")
    return problems


def _system_packages(system) -> list[str]:
    if system is None:
        return []
    problems = []
    for index, archive in enumerate(system.archives):
        if not isinstance(archive.name, str) or not _ARCHIVE_NAME.fullmatch(archive.name):
            problems.append(f"system_packages.archives[{index}].name is not an archive's name (debian, ubuntu, ...)")
        if archive.in_release:
            problems += _hex(archive.in_release, f"system_packages.archives[{index}].in_release")
        if archive.snapshot:
            problems += _url(archive.snapshot, f"system_packages.archives[{index}].snapshot", signed_archive=True)
    for package in system.packages:
        where = f"system_packages.{one_line(str(package.name))}"
        if not isinstance(package.name, str) or not grammar.DEB_PACKAGE.fullmatch(package.name):
            problems.append(f"{where}: the name is not a Debian package name")
            continue
        if not isinstance(package.version, str) or not DEB_VERSION.fullmatch(package.version):
            problems.append(f"{where}.version is not a Debian version")
        problems += _hex(package.sha256, f"{where}.sha256")
        problems += _relative_file(package.filename, f"{where}.filename", _POOL_PART)
        if isinstance(package.filename, str) and not DEB_FILE.fullmatch(package.basename):
            problems.append(f"{where}.filename does not end in a name_version_arch.deb file name")
        if not 0 <= package.archive < len(system.archives):
            problems.append(f"{where}.archive names no archive of the entry")
        if package.size < 0:
            problems.append(f"{where}.size is negative")
    return problems


def _outcome(outcome) -> list[str]:
    problems = []
    image = outcome.image
    if image is not None:
        problems += _digest(image.image_id, "image.image_id", optional=False)
        problems += _hex(image.inputs_hash, "image.inputs_hash")
        problems += _digest(image.manifest_digest, "image.manifest_digest")
        problems += _digest(image.base.manifest_digest, "image.base.manifest_digest")
        problems += _digest(image.base.image_id, "image.base.image_id")
        for key in ("report", "provenance", "sbom"):
            if getattr(image, key) is not None:
                problems += _record_path(getattr(image, key), f"image.{key}")
        if not all(isinstance(tag, str) and _TAG.fullmatch(tag) for tag in image.tags) \
                or not _TAG.fullmatch(image.immutable_tag):
            problems.append("image.tags are not image tags")
    if outcome.push is not None:
        problems += _digest(outcome.push.manifest_digest, "push.manifest_digest", optional=False)
        if "@" in outcome.push.registry:
            problems.append("push.registry carries a user name or password")
    if outcome.pinned is not None:
        problems += _digest(outcome.pinned.image_id, "pinned.image_id", optional=False)
        problems += _digest(outcome.pinned.manifest_digest, "pinned.manifest_digest")
    return problems


def problems(name: str, raw: dict, entry: LockEntry) -> list[str]:
    """What is wrong with one entry (`raw` as the file holds it, `entry` as read from it)."""
    resolution = entry.resolution
    found = []
    if resolution.stack != name or not grammar.NAME.fullmatch(name):
        found.append("the entry's stack is not its key, or not a row name")
    found += _hex(resolution.pins_hash, "pins_hash")
    found += [p for index in resolution.indexes for p in _url(index, "indexes[]")]
    found += _digest(resolution.base.manifest_digest, "base.manifest_digest")
    found += _digest(resolution.base.image_id, "base.image_id")
    if not isinstance(resolution.base.image, str) or not grammar.IMAGE.fullmatch(resolution.base.image):
        found.append("base.image is not an image reference")
    found += _distributions(resolution)
    stored = raw.get("resolution", {}).get("distributions_hash") if isinstance(raw, dict) else None
    if stored is not None and stored != resolution.distributions_hash:
        found.append("distributions_hash is not the hash of its distributions (edited by hand?)")
    found += _system_packages(resolution.system_packages)
    found += _outcome(entry.outcome)
    return found
