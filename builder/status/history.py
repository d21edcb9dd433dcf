"""Bench figures over time: every measured figure the lock has held, dated by the commit that first
recorded it (the git history of the lock file), then those only the working tree's lock holds.

The lock keeps one figure per mode, hardware and model (a new measurement replaces the old), so its
history is where earlier figures live. Without git, or outside a checkout, only the current figures."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.errors import UserError
from builder.lock import store

WORKING_TREE = "working tree"
MAX_COMMITS = 200  # the newest commits of the lock file that are read


@dataclass(frozen=True)
class BenchPoint:
    stack: str
    mode: str
    tok_s: float
    verdict: str | None
    image_id: str
    hardware: str
    model: str
    when: str  # the commit's date (ISO 8601), or WORKING_TREE
    commit: str | None  # None: not committed


def bench_history(lock_path: Path, root: Path) -> tuple[BenchPoint, ...]:
    """Each distinct measured figure once, oldest first."""
    versions = []
    for commit, date, text in _committed_versions(Path(lock_path), Path(root)):
        try:
            versions.append((commit, date, store.parse(text, Path(lock_path))))
        except UserError:
            continue  # a version this builder cannot read (an unknown schema): it adds no figures
    versions.append((None, WORKING_TREE, store.read(lock_path)))
    seen: set[tuple] = set()
    points = []
    for commit, when, lock in versions:
        for name, entry in sorted(lock.stacks.items()):
            for figure in entry.outcome.bench.measured:
                key = (name, figure.mode, figure.hardware, figure.model, figure.image_id, figure.tok_s)
                if key in seen:
                    continue
                seen.add(key)
                points.append(BenchPoint(name, figure.mode, figure.tok_s, figure.verdict, figure.image_id,
                                         figure.hardware, figure.model, when, commit))
    return tuple(points)


def _committed_versions(lock_path: Path, root: Path) -> list[tuple[str, str, str]]:
    """(commit, date, text) of each committed version of the lock, oldest first."""
    git = shutil.which("git")
    try:
        relative = lock_path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return []  # a lock outside the project (BUILDER_LOCK) has no history there
    if git is None:
        return []
    log = subprocess.run([git, "-C", str(root), "log", f"--max-count={MAX_COMMITS}", "--format=%H %cI",
                          "--", relative], capture_output=True, text=True)
    if log.returncode != 0:
        return []  # not a git checkout
    found = []
    for line in reversed(log.stdout.splitlines()):
        commit, _, date = line.partition(" ")
        # `./` makes the path relative to root, which may sit below the repository's top.
        shown = subprocess.run([git, "-C", str(root), "show", f"{commit}:./{relative}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:
            found.append((commit, date, shown.stdout))
    return found
