"""`builder lock --check`: a recorded image built from other inputs than the tree has now is named,
with the part that moved (a file, the base digest, SOURCE_DATE_EPOCH); a pinned one is named as such."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from builder.build_stack import context
from builder.config.matrix import load_matrix
from builder.lock import check as lock_check, records, store
from builder.lock.model import ImageRecord, LockedBase
from builder.lock.resolution import record_base
from checkouts import clone_checkout, run_builder
from lock_values import build_report, smoke_report

BASE = "sha256:" + "b" * 64
IMAGE = "sha256:" + "1" * 64


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A clone whose lock records an image of the cu128-local row built from exactly its current inputs."""
    root = clone_checkout(tmp_path / "clone")
    monkeypatch.delenv("BUILDER_LOCK", raising=False)
    matrix = load_matrix(root / "matrix.toml")
    stack = matrix.stack("sglang-0.5.9-cu128-local")
    _only_resolved(root / "matrix.lock")  # other rows' images were built on the real base, not BASE
    record_base("debian-bookworm", BASE, path=root / "matrix.lock")
    inputs = context.build_inputs(stack, root, BASE)
    report = root / "build-reports" / f"{stack.name}.json"
    build_report(stack.name, IMAGE, inputs.files).write(report)
    base = LockedBase(stack.base.name, stack.base.image, True, image_id=BASE)
    records.record_build(stack.name, ImageRecord(
        image_id=IMAGE, immutable_tag="sglang:x", tags=("sglang:x", "sglang:y"), inputs_hash=inputs.hash, base=base,
        source_date_epoch=stack.source_date_epoch, report=f"build-reports/{stack.name}.json",
        provenance="p.json"), smoke_report(image=IMAGE, stack=stack.name), root / "matrix.lock")
    return root, matrix, stack


def _only_resolved(lock: Path) -> None:
    """Every row's recorded image and smoke result taken out of a lock: resolved, never built."""
    data = json.loads(lock.read_text())
    for entry in data["stacks"].values():
        entry["outcome"].update(image=None, smoke=None, status="resolved")
    lock.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def problems(root: Path, matrix, stacks=None) -> list[str]:
    return lock_check.stale_rows(stacks or matrix.all_rows(), root, root / "matrix.lock", context.build_inputs)[0]


def test_a_current_record_passes_and_rows_without_images_are_notes(project):
    root, matrix, _ = project
    found, notes = lock_check.stale_rows(matrix.all_rows(), root, root / "matrix.lock", context.build_inputs)
    assert found == []
    assert "sglang-0.5.9-cu130: not locked" in notes


def test_a_changed_patch_is_named(project):
    root, matrix, stack = project
    patch = root / "patches/sglang/0.5.9/0002-allreduce-fusion-apply-sm120.patch"
    patch.write_text("one more header line\n" + patch.read_text())
    assert problems(root, matrix) == [
        f"{stack.name}: recorded image {IMAGE} was built from other inputs than the tree has now "
        "(changed: patches/sglang/0.5.9/0002-allreduce-fusion-apply-sm120.patch); rebuild it and commit matrix.lock"]


def test_a_new_base_digest_or_epoch_is_named(project):
    root, matrix, stack = project
    record_base("debian-bookworm", "sha256:" + "c" * 64, path=root / "matrix.lock")
    assert f"(base pin {BASE} -> sha256:{'c' * 64})" in problems(root, matrix)[0]
    record_base("debian-bookworm", BASE, path=root / "matrix.lock")
    later = dataclasses.replace(stack, source_date_epoch=stack.source_date_epoch + 1)
    assert f"(SOURCE_DATE_EPOCH {stack.source_date_epoch} -> {stack.source_date_epoch + 1})" in \
        problems(root, matrix, (later,))[0]


def test_a_pinned_image_the_inputs_cannot_make_is_named_and_the_command_exits_1(project):
    root, matrix, stack = project
    records.pin(stack.name, [], root / "matrix.lock")
    (root / "builder/runtime/stackinfo.py").write_text("# changed\n")
    env = {key: value for key, value in os.environ.items() if key != "BUILDER_LOCK"}
    result = run_builder("lock", "--check", env=env, cwd=root)
    assert result.returncode == 1
    assert result.stderr == (
        f"builder: error: {stack.name}: pinned image {IMAGE} was built from other inputs than the tree has now "
        "(changed: builder/runtime/stackinfo.py); rebuild it and commit matrix.lock\n")


def test_a_row_resolved_from_other_pins_is_named(project):
    root, matrix, stack = project
    moved = dataclasses.replace(stack, packages=tuple(
        dataclasses.replace(p, version="0.5.10") if p.name == "sglang" else p for p in stack.packages))
    assert problems(root, matrix, (moved,)) == [
        f"{stack.name}: resolved from other pins than matrix.toml has now; run `builder lock --stack {stack.name}`"]


def _lock_registry_row_debs(root: Path, matrix) -> tuple:
    """The cu128 registry row's system packages locked (made-up files) and its debs.txt rendered from them."""
    from builder.render import render
    from lock_values import system_packages_of
    stack = matrix.stack("sglang-0.5.9-cu128")
    locked = system_packages_of(stack.base.apt)

    def change(lock):
        found = lock.require(stack.name)
        lock.put(dataclasses.replace(found, resolution=dataclasses.replace(found.resolution, system_packages=locked)))

    store.update(change, root / "matrix.lock")
    render.write(render.render_all((stack,), matrix.project), root)
    return stack, locked


def test_a_rendered_deb_list_that_is_not_the_locked_packages_is_named(project):
    root, matrix, _ = project
    stack, locked = _lock_registry_row_debs(root, matrix)
    assert problems(root, matrix) == []
    listing = root / "images" / stack.name / "debs.txt"
    listing.write_text(listing.read_text().replace(locked.packages[0].basename, "patch_9.9_amd64.deb"))
    assert problems(root, matrix) == [
        f"{stack.name}: debs.txt installs other .debs than the lock records ({locked.packages[0].basename}); "
        f"run `builder lock --stack {stack.name}` then `builder render`"]


def test_system_packages_locked_for_another_package_list_are_named(project):
    root, matrix, _ = project
    stack, _ = _lock_registry_row_debs(root, matrix)
    other = dataclasses.replace(stack.base.apt, packages=("patch",))
    moved = dataclasses.replace(stack, base=dataclasses.replace(stack.base, apt=other))
    assert problems(root, matrix, [moved]) == [
        f"{stack.name}: its system packages are not locked as matrix.toml names them; "
        f"run `builder lock --stack {stack.name}` then `builder render`"]


def test_a_base_made_before_its_packages_moved_is_named(project):
    root, matrix, stack = project

    def change(lock):  # what `builder lock` does when the base's packages move
        found = lock.require(stack.name)
        base = found.resolution.base.pinned_by("")
        lock.put(dataclasses.replace(found, resolution=dataclasses.replace(found.resolution, base=base)))

    store.update(change, root / "matrix.lock")
    assert problems(root, matrix) == [
        f"{stack.name}: recorded image {IMAGE} was built from other inputs than the tree has now (the local base's "
        f"locked packages moved since {BASE} was made; `builder base` makes and records the new one); rebuild it "
        f"and commit matrix.lock"]
