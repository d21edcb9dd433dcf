"""One home for each path and name the builder, the rendered Dockerfiles and the image agree on.

The project (matrix, lock, patches, templates, renders, reports, reference figures) is the directory
that holds the matrix file, never where the builder package happens to be installed: an installed
`builder` run in any checkout works on that checkout.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

# Inside every image.
VENV = "/opt/venv"
VENV_PYTHON = f"{VENV}/bin/python"
TOOLS_DIR = "/opt/builder"  # stack.json, patches, requirements and the in-image tools (runtime/)
# The fixed non-root account the image runs as (builder/runtime/add_user.sh). uid 1000 is taken in the
# CUDA bases (Ubuntu 24.04's own `ubuntu` account), so the next one, the same on every base.
RUNTIME_USER = "sglang"
RUNTIME_UID = 1001  # and gid
RUNTIME_HOME = "/home/sglang"

IMAGES = "images"  # images/<stack>/: the rendered files of each stack row, in the project

# The locked wheels: a directory of the build context, mounted read-only into the install steps.
# The locked wheels and each install group's plan (builder/oci/wheel_layer.py): a directory of the build
# context, mounted read-only into the install steps.
WHEELS_CONTEXT_DIR = "wheels"
WHEELS_MOUNT = "/run/wheels"


def wheel_plan_file(group: str) -> str:
    """The plan of one install group, in the wheels' directory of the build context."""
    return f"{group}.plan.json"
# The locked .debs a registry row adds to its base: the same, for its system packages step.
DEBS_CONTEXT_DIR = "debs"
DEBS_MOUNT = "/run/debs"

# The base `builder base` makes with mmdebstrap, named after the matrix's [local_base].
LOCAL_BASE_REPOSITORY = "localhost/builder-base"


def stack_dir(stack) -> str:
    """images/<stack name>, relative to the project (`stack` is a config.stack.Stack)."""
    return f"{IMAGES}/{stack.name}"


def project_relative(path: str | Path, root: Path) -> str:
    """A path inside the project as the lock and reports store it: relative to the project root, so
    they read the same in any clone; a path outside it is kept as given."""
    path = Path(path)
    if path.is_absolute():
        for base in (Path(root), Path(root).resolve()):
            with contextlib.suppress(ValueError):
                return path.relative_to(base).as_posix()
    return path.as_posix()


def local_base_tag(name: str) -> str:
    return f"{LOCAL_BASE_REPOSITORY}:{name}"


def cache_root() -> Path:
    """What the builder downloads, kept across runs: $BUILDER_CACHE, else ~/.cache/builder."""
    return Path(os.environ.get("BUILDER_CACHE") or Path.home() / ".cache" / "builder")


def layer_listings_dir() -> Path:
    """Each layer tar's listing by diff_id (oci/layer_listing.py): kept by the build that writes the
    layer, read by the smoke gate."""
    return cache_root() / "layer-listings"


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def of_matrix(cls, matrix_path: str | Path) -> "Project":
        return cls(Path(matrix_path).resolve().parent)

    @property
    def lock(self) -> Path:
        """matrix.lock beside the matrix; BUILDER_LOCK points elsewhere (tests, scratch runs)."""
        return Path(os.environ.get("BUILDER_LOCK") or self.root / "matrix.lock")

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    @property
    def reports(self) -> Path:
        return self.root / "build-reports"

    @property
    def reference_figures(self) -> Path:
        return self.root / "bench" / "reference.toml"
