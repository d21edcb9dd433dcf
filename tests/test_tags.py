"""Immutable tags follow the inputs: same inputs, same tag; a changed patch or tool, a new one."""

from __future__ import annotations

import shutil
from pathlib import Path

from builder import tags
from builder.matrix import load_matrix

REPO = Path(__file__).resolve().parent.parent
STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128-local")


def copy_inputs(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for folder in ("images", "patches", "builder/runtime"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_copied_sources_in_order():
    dockerfile = (REPO / "images" / STACK.name / "Dockerfile").read_text()
    sources = tags.copied_sources(dockerfile)
    assert sources[0] == f"images/{STACK.name}/requirements/10-torch.txt"
    assert "builder/runtime/apply_patch.py" in sources and sources[-1] == "builder/runtime/"


def test_same_inputs_same_tag(tmp_path):
    root = copy_inputs(tmp_path)
    assert tags.inputs_hash(STACK, root) == tags.inputs_hash(STACK, REPO)


def test_patch_or_tool_change_gives_a_new_tag(tmp_path):
    root = copy_inputs(tmp_path)
    before = tags.inputs_hash(STACK, root)
    patch = root / "patches/sglang/0.5.9/0001-torch-symm-mem-sm120.patch"
    patch.write_text("changed header\n" + patch.read_text())
    after_patch = tags.inputs_hash(STACK, root)
    (root / "builder/runtime/stackinfo.py").write_text("# changed\n")
    after_tool = tags.inputs_hash(STACK, root)
    assert len({before, after_patch, after_tool}) == 3


def test_tag_names():
    digest = "0123456789abcdef" * 4
    assert tags.immutable_tag(STACK, digest) == "sglang:0.5.9-cu128-local-0123456789ab"
    assert tags.moving_tag(STACK) == "sglang:0.5.9-cu128-local"
    assert tags.candidate_tag(STACK, digest) == "sglang-candidate:0.5.9-cu128-local-0123456789ab"
