"""A clone of the project as a new user gets it, and the `builder` command line run in one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
# The real stack the end-to-end tests build (conftest's `built`): the README's default, CUDA 13 from the
# default index. BUILT_ROW is the matrix row as `--stack` takes it; BUILT_STACK the built (local) row.
BUILT_ROW = "sglang-0.5.23-cu130"
BUILT_STACK = f"{BUILT_ROW}-local"


def clone_checkout(destination: Path) -> Path:
    """A clone of the repository as a new user gets it, carrying this checkout's uncommitted changes
    to tracked files (staged in the clone), so tests see the code under test before it is committed."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(destination)], check=True)
    diff = subprocess.run(["git", "-C", str(REPO), "diff", "HEAD", "--binary"], capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "-C", str(destination), "apply", "--index", "--allow-empty"], input=diff, check=True)
    return destination


def in_image_tools(directory: Path) -> Path:
    """builder/runtime copied as the image has it: <root>/builder/runtime, no builder/__init__.py, no
    byte-code; returns <root>, the directory to put on PYTHONPATH (/opt in the image)."""
    root = directory / "opt"
    shutil.copytree(REPO / "builder" / "runtime", root / "builder" / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def link_project_files(directory: Path) -> None:
    """Make `directory` a project beside a matrix written there: the repository's patch series,
    templates and reference figures (a matrix's patches, templates and figures are found beside it)."""
    for name in ("patches", "templates", "bench"):
        if not (directory / name).exists():
            (directory / name).symlink_to(REPO / name)


def builder_command(*args: str) -> list[str]:
    """The `builder` command line as `python -m builder.cli`: run from a clone, it runs that clone's code."""
    return [sys.executable, "-m", "builder.cli", *args]


def run_builder(*args: str, env: dict | None = None, cwd: Path = REPO,
                timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(builder_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
