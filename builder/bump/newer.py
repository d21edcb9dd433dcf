"""Is there a release on pip's default index newer than every stack's pin of a package? (bump.yml)"""

from __future__ import annotations

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.bump.index import Index
from builder.config.matrix import Matrix
from builder.errors import UserError


def newest_beyond_stacks(matrix: Matrix, package: str, index: Index | None = None) -> tuple[str, str] | None:
    """(newest final release, the stack pinning the highest version) when the index's newest is newer
    than every stack's pin, else None."""
    package = canonicalize_name(package)
    pinned = [(row.package(package).parsed_version, row.family) for row in matrix.registry_stacks
              if row.package(package)]
    if not pinned:
        raise UserError(f"no stack pins {package}")
    project = (index or Index()).project(package)
    if project is None:
        raise UserError(f"unknown package {package}: pip's default index has no such project")
    releases = [v for v in project.versions() if not v.is_prerelease and not v.is_devrelease]
    highest, family = max(pinned)
    if not releases or releases[-1] <= Version(highest.public):
        return None
    return str(releases[-1]), family
