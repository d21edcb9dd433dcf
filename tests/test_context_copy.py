"""COPY into an assembled root (builder/oci/context_copy.py) and the runtime's user for USER
(builder/engine/step_runner.py), without an engine: the engine-path tests (test_write_once.py) hold
the whole step to `buildah build`."""

from __future__ import annotations

import os
import stat

import pytest

from builder.engine.step_runner import process_user
from builder.errors import BuildFailure
from builder.oci.context_copy import copy_into, inside


def _context(tmp_path):
    context = tmp_path / "ctx"
    (context / "dir" / "sub").mkdir(parents=True)
    (context / "dir" / "a.txt").write_text("a\n")
    (context / "dir" / "sub" / "b.sh").write_text("#!/bin/sh\n")
    os.chmod(context / "dir" / "sub" / "b.sh", 0o4755)
    os.symlink("a.txt", context / "dir" / "link")
    (context / "one.txt").write_text("one\n")
    os.chmod(context / "one.txt", 0o640)
    os.utime(context / "one.txt", ns=(1_000_000_000, 1_000_000_000))
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    return context, root


def test_a_file_goes_to_the_destination_or_into_it(tmp_path):
    context, root = _context(tmp_path)
    copy_into(root, [context / "one.txt"], "/opt/x/renamed.txt")
    made = root / "opt" / "x" / "renamed.txt"
    assert made.read_text() == "one\n"
    info = os.lstat(made)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, info.st_mtime_ns) == (0o640, 0, 0, 1_000_000_000)
    assert stat.S_IMODE(os.lstat(root / "opt").st_mode) == 0o755
    copy_into(root, [context / "one.txt"], "/opt/y/")
    assert (root / "opt" / "y" / "one.txt").read_text() == "one\n"
    copy_into(root, [context / "one.txt", context / "dir" / "a.txt"], "/opt/multi")
    assert sorted(os.listdir(root / "opt" / "multi")) == ["a.txt", "one.txt"]
    # An existing directory takes the file inside it.
    copy_into(root, [context / "one.txt"], "/etc")
    assert (root / "etc" / "one.txt").is_file()


def test_a_directory_copies_its_contents_with_modes_and_links(tmp_path):
    context, root = _context(tmp_path)
    copy_into(root, [context / "dir"], "/opt/d/")
    assert sorted(os.listdir(root / "opt" / "d")) == ["a.txt", "link", "sub"]
    assert os.readlink(root / "opt" / "d" / "link") == "a.txt"
    script = os.lstat(root / "opt" / "d" / "sub" / "b.sh")
    assert (stat.S_IMODE(script.st_mode), script.st_uid) == (0o4755, 0)
    # Copied again over itself: replaced, not duplicated.
    copy_into(root, [context / "dir"], "/opt/d")
    assert sorted(os.listdir(root / "opt" / "d")) == ["a.txt", "link", "sub"]


def test_the_images_links_never_lead_out_of_the_root(tmp_path):
    context, root = _context(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), root / "opt")  # absolute: read from the root, as in the image
    (root / str(outside).lstrip("/")).mkdir(parents=True)
    copy_into(root, [context / "one.txt"], "/opt/escape/")
    assert list(outside.iterdir()) == []
    assert (root / str(outside).lstrip("/") / "escape" / "one.txt").is_file()
    os.symlink("../../..", root / "etc" / "up")
    assert inside(root, "/etc/up/x") == root / "x"


def test_bad_copies_are_one_line(tmp_path):
    context, root = _context(tmp_path)
    (root / "file").write_text("")
    with pytest.raises(BuildFailure, match="is not a directory"):
        copy_into(root, [context / "one.txt"], "/file/x/")
    with pytest.raises(BuildFailure, match="no such file"):
        copy_into(root, [context / "missing"], "/opt/")


def test_user_names_come_from_the_images_own_tables(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\nsglang:x:1001:1002::/home/sglang:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\nsglang:x:1002:\nvideo:x:44:\n")
    assert process_user(root, None) == {"uid": 0, "gid": 0}
    assert process_user(root, "sglang") == {"uid": 1001, "gid": 1002}
    assert process_user(root, "1001") == {"uid": 1001, "gid": 1002}
    assert process_user(root, "1001:1001") == {"uid": 1001, "gid": 1001}
    assert process_user(root, "sglang:video") == {"uid": 1001, "gid": 44}
    assert process_user(root, "4242") == {"uid": 4242, "gid": 0}
    with pytest.raises(BuildFailure, match="no such user"):
        process_user(root, "nobody-here")
