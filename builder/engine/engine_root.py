"""A second buildah to build with: a Debian root (mmdebstrap) holding another release's buildah and runc,
run through `builder.engine.chrooted`. It is how this project checks that the image does not depend on
the engine's version (docs/engines.md): the host has bookworm's buildah, the root trixie's.

The root is cached under a directory named by the recipe's hash (suite, packages, this module's layout
version) and marked complete only when mmdebstrap finished; apt's default mirror decides the exact
package versions, and `buildah --version` inside says which one it got.

    python -m builder.engine.engine_root [--suite trixie] [--parent /var/tmp/engine]

prints the command prefix to put in BUILDER_BUILDAH.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from builder.errors import BuildFailure, UserError

DEFAULT_PARENT = Path("/var/tmp/engine")
DEFAULT_SUITE = "trixie"
PACKAGES = ("buildah", "netavark", "runc")
_LAYOUT = 1  # bump when what goes into the root changes
_COMPLETE = ".complete"


def root_path(parent: Path, suite: str, packages: tuple[str, ...] = PACKAGES) -> Path:
    recipe = json.dumps({"suite": suite, "packages": sorted(packages), "layout": _LAYOUT}, sort_keys=True)
    return parent / f"{suite}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def containers_conf() -> str:
    """buildah in a newer release asks for ulimits above this host's hard limits (runc then fails to
    start any RUN step); give every container the host's own hard limits instead. Not in any image."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limits = [f"nofile={nofile}:{nofile}" if nofile != resource.RLIM_INFINITY else "nofile=1048576:1048576"]
    if nproc != resource.RLIM_INFINITY:
        limits.append(f"nproc={nproc}:{nproc}")
    return "[containers]\ndefault_ulimits = [" + ", ".join(f'"{limit}"' for limit in limits) + "]\n"


def make_root(parent: Path = DEFAULT_PARENT, suite: str = DEFAULT_SUITE,
              packages: tuple[str, ...] = PACKAGES) -> Path:
    """The root for `suite` with `packages`, made with mmdebstrap when not cached yet."""
    root = root_path(parent, suite, packages)
    if (root / _COMPLETE).is_file():
        return root
    if shutil.which("mmdebstrap") is None:
        raise UserError("mmdebstrap not found: run scripts/setup-host (or apt-get install mmdebstrap)")
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    parent.mkdir(parents=True, exist_ok=True)
    # No mirror given: apt's default for the suite.
    argv = ["mmdebstrap", "--mode=root", "--variant=apt", f"--include={','.join(packages)}", suite, str(partial)]
    result = subprocess.run(argv, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
        shutil.rmtree(partial, ignore_errors=True)
        raise BuildFailure(f"mmdebstrap of {suite} with {', '.join(packages)} failed: {' | '.join(tail)}")
    conf = partial / "etc" / "containers" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(containers_conf())
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    (root / _COMPLETE).write_text(suite + "\n")
    return root


def buildah_prefix(root: Path) -> list[str]:
    """The command that runs the root's buildah (BUILDER_BUILDAH, split as a shell would)."""
    return [sys.executable, "-m", "builder.engine.chrooted", str(root), "buildah"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder.engine.engine_root")
    parser.add_argument("--suite", default=DEFAULT_SUITE)
    parser.add_argument("--parent", type=Path, default=DEFAULT_PARENT)
    args = parser.parse_args(argv)
    try:
        root = make_root(args.parent, args.suite)
    except (UserError, BuildFailure) as error:
        print(f"engine_root: error: {error}", file=sys.stderr)
        return error.exit_code
    print(shlex.join(buildah_prefix(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
