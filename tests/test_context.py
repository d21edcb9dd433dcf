"""The build context is exactly the hashed inputs: tracked files under the COPY sources, nothing from
the clone (its path, untracked files, byte-code caches, umask), and the same set is hashed and copied."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from builder.build_stack import context
from builder.config import tags
from builder.config.matrix import load_matrix
from builder.errors import UserError
from checkouts import REPO, clone_checkout

STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128-local")
BASE = "sha256:" + "b" * 64


def clone(tmp_path: Path, name: str = "clone") -> Path:
    return clone_checkout(tmp_path / name)


def inputs(root: Path) -> context.BuildInputs:
    return context.build_inputs(STACK, root, BASE)


def test_copied_sources_in_order():
    dockerfile = (REPO / "images" / STACK.name / "Dockerfile").read_text()
    sources = context.copied_sources(dockerfile)
    assert sources[:3] == ["builder/runtime/add_user.sh", "builder/runtime/install_wheels.py",
                           f"images/{STACK.name}/requirements/"]
    assert "builder/runtime/apply_patch.py" in sources and sources[-1] == "builder/runtime/"


def test_the_set_is_the_tracked_files_under_each_copy_source(tmp_path):
    root = clone(tmp_path)
    files = {f.path for f in inputs(root).files}
    tracked = set(subprocess.run(["git", "-C", str(root), "ls-files", "builder/runtime"], capture_output=True,
                                 text=True, check=True).stdout.split())
    assert tracked and tracked <= files
    assert {p for p in files if p.startswith("builder/runtime/")} == tracked
    assert "patches/sglang/0.5.9/0001-torch-symm-mem-sm120.patch" in files
    assert not [p for p in files if p.startswith(("build-reports", "matrix.lock")) or "__pycache__" in p]


def test_clone_path_byte_code_untracked_files_and_umask_leave_the_hash_alone(tmp_path):
    first, second = clone(tmp_path, "first"), clone(tmp_path, "elsewhere/second")
    planted = second / "builder/runtime/__pycache__"
    planted.mkdir()
    (planted / "entrypoint.cpython-311.pyc").write_bytes(b"\x00stale byte code")
    (second / "builder/runtime/scratch_notes.py").write_text("untracked\n")
    (second / "patches/sglang/0.5.9/0099-untracked.patch").write_text("not in the series\n")
    tool = second / "builder/runtime/stackinfo.py"
    tool.chmod(0o664)  # a clone made under umask 002
    assert inputs(first).hash == inputs(second).hash
    assert inputs(first).files == inputs(second).files


def test_a_change_to_a_patch_a_tool_the_base_or_an_executable_bit_gives_a_new_hash(tmp_path):
    root = clone(tmp_path)
    seen = {inputs(root).hash}
    patch = root / "patches/sglang/0.5.9/0001-torch-symm-mem-sm120.patch"
    patch.write_text("changed header\n" + patch.read_text())
    seen.add(inputs(root).hash)
    (root / "builder/runtime/stackinfo.py").write_text("# changed\n")
    seen.add(inputs(root).hash)
    (root / "builder/runtime/serve/bench.py").chmod(0o755)
    seen.add(inputs(root).hash)
    seen.add(context.build_inputs(STACK, root, "sha256:" + "c" * 64).hash)
    assert len(seen) == 5


def test_an_untracked_copy_source_is_refused(tmp_path):
    root = clone(tmp_path)
    dockerfile = root / "images" / STACK.name / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY notes/todo.txt /opt/todo.txt\n")
    (root / "notes").mkdir()
    (root / "notes/todo.txt").write_text("untracked\n")
    with pytest.raises(UserError, match=r"^notes/todo.txt: COPY source is not tracked by git \(commit it\)$"):
        inputs(root)


def test_an_export_without_git_hashes_like_the_clone(tmp_path):
    root = clone(tmp_path)
    export = tmp_path / "export"
    archive = subprocess.run(["git", "-C", str(root), "stash", "create"], capture_output=True, text=True).stdout.strip()
    tree = archive or "HEAD"
    tar = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", tree], capture_output=True, check=True)
    export.mkdir()
    subprocess.run(["tar", "-x", "-C", str(export)], input=tar.stdout, check=True)
    (export / "builder/runtime/__pycache__").mkdir()
    (export / "builder/runtime/__pycache__/x.pyc").write_bytes(b"\x00")
    assert inputs(export).hash == inputs(root).hash
    # The same export unpacked in a folder the enclosing clone ignores (as verify does under build/).
    inside = root / "build" / "export"
    inside.parent.mkdir()
    subprocess.run(["cp", "-a", str(export), str(inside)], check=True)
    assert inputs(inside).hash == inputs(root).hash


def test_assembled_context_holds_exactly_the_hashed_files(tmp_path):
    root = clone(tmp_path)
    (root / "builder/runtime/__pycache__").mkdir()
    (root / "builder/runtime/__pycache__/x.pyc").write_bytes(b"\x00")
    (root / "builder/runtime/stackinfo.py").chmod(0o600)
    built = inputs(root)
    destination = tmp_path / "context"
    dockerfile = context.assemble(built, root, destination)
    assert dockerfile == destination / "images" / STACK.name / "Dockerfile"
    on_disk = sorted(p.relative_to(destination).as_posix() for p in destination.rglob("*") if p.is_file())
    assert on_disk == sorted([f.path for f in built.files] + [built.dockerfile])
    for item in built.files:
        info = (destination / item.path).stat()
        assert stat.S_IMODE(info.st_mode) == item.mode == 0o644
        assert int(info.st_mtime) == STACK.source_date_epoch


def test_a_file_changed_after_hashing_is_not_copied(tmp_path):
    root = clone(tmp_path)
    built = inputs(root)
    (root / "builder/runtime/stackinfo.py").write_text("# changed meanwhile\n")
    with pytest.raises(UserError, match=r"^builder/runtime/stackinfo.py changed while the build started"):
        context.assemble(built, root, tmp_path / "context")


def test_tag_names():
    digest = "0123456789abcdef" * 4
    assert tags.immutable_tag(STACK, digest) == "sglang:0.5.9-cu128-local-0123456789ab"
    assert tags.moving_tag(STACK) == "sglang:0.5.9-cu128-local"
    assert tags.candidate_tag(STACK, digest) == "sglang-candidate:0.5.9-cu128-local-0123456789ab"


def test_symbolic_links_are_refused(tmp_path):
    root = clone(tmp_path)
    target = root / "builder/runtime/stackinfo.py"
    target.unlink()
    os.symlink("bench.py", target)
    with pytest.raises(UserError, match="builder/runtime/stackinfo.py: copied into the image but a symbolic link"):
        inputs(root)
