"""A scratch tree that a killed run left mounts in (a private storage's overlay bind mount) is removed,
and `builder verify` makes its scratch again instead of failing on it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from builder.files import mounts_below, remove_scratch
from builder.verify import verify


def _bind_mount_inside(root: Path) -> Path:
    """As containers/storage does with its overlay directory: a bind mount of a folder onto itself."""
    point = root / "storage-1" / "root" / "overlay"
    point.mkdir(parents=True)
    (point / "layer").write_text("data\n")
    subprocess.run(["mount", "--bind", str(point), str(point)], check=True)
    return point


def test_a_scratch_tree_with_a_mount_left_in_it_is_removed(tmp_path):
    scratch = tmp_path / "scratch with space"
    point = _bind_mount_inside(scratch)
    assert mounts_below(scratch) == [point]
    remove_scratch(scratch)
    assert not scratch.exists()
    assert mounts_below(tmp_path) == []


def test_verify_makes_its_scratch_again_after_a_killed_run(tmp_path):
    left = tmp_path / verify.WORKDIR / "dockerfile"
    point = _bind_mount_inside(left)
    workdir = verify._scratch(tmp_path, "dockerfile")
    assert workdir == left and workdir.is_dir() and list(workdir.iterdir()) == []
    assert not point.exists() and mounts_below(tmp_path) == []
