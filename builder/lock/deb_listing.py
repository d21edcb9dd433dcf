"""A registry row's system packages step: the rendered list of its locked .debs, and whether the
rendered list still is the lock's.

images/<stack>/debs.txt holds one line per locked file, "<sha256>  <file name>" (sha256sum's format),
in name order; builder/runtime/install_debs.sh checks every file of the read-only debs/ mount against
it before dpkg installs them. No rendered Dockerfile runs apt: nothing reads a package index while
building.
"""

from __future__ import annotations

from builder.config.stack import Stack
from builder.escape import comment
from builder.lock.system_packages import SystemPackages

DEBS_FILE = "debs.txt"
_UNLOCKED = "# UNLOCKED"


def listing(locked: SystemPackages) -> str:
    return "".join(f"{package.sha256}  {package.basename}\n" for package in locked.packages)


def unlocked_listing(stack: Stack) -> str:
    """For a row `builder lock` has not resolved: sha256sum --strict refuses it, and so does the build."""
    return (f"{_UNLOCKED}: run `builder lock --stack {stack.name}` where its archive is reachable.\n"
            f"# {comment(' '.join(stack.base.system_packages))}\n")


def is_locked(text: str) -> bool:
    return not text.startswith(_UNLOCKED)


def stale(rendered: str, locked: SystemPackages | None) -> str | None:
    """Why the rendered list is not the lock's packages, or None when it is."""
    if locked is None:
        return "the lock records no system packages for it"
    if rendered != listing(locked):
        names = {line.split()[-1] for line in rendered.splitlines() if not line.startswith("#")}
        moved = sorted(p.basename for p in locked.packages if p.basename not in names)
        return f"{DEBS_FILE} installs other .debs than the lock records ({', '.join(moved[:5]) or 'files removed'})"
    return None
