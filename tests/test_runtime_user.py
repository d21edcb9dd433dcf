"""The image runs as a fixed non-root account, added with nothing that varies between builds."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from builder.paths import RUNTIME_HOME, RUNTIME_UID, RUNTIME_USER
from checkouts import REPO

ADD_USER = REPO / "builder" / "runtime" / "add_user.sh"
DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_image_runs_as_the_fixed_account_after_its_last_build_step(path: Path):
    lines = path.read_text().splitlines()
    users = [i for i, line in enumerate(lines) if line.startswith("USER ")]
    runs = [i for i, line in enumerate(lines) if line.startswith("RUN ")]
    assert len(users) == 1 and lines[users[0]] == f"USER {RUNTIME_UID}:{RUNTIME_UID}"
    assert users[0] > runs[-1], "build steps run as root; the server does not"
    added = [i for i, line in enumerate(lines) if "/opt/builder/add_user.sh" in line and line.startswith("RUN ")]
    assert len(added) == 1
    assert lines[added[0]] == (f'RUN ["/bin/sh", "/opt/builder/add_user.sh", "{RUNTIME_USER}", "{RUNTIME_UID}", '
                               f'"{RUNTIME_HOME}", "/cache"]')
    venv = next(i for i, line in enumerate(lines) if re.match(r'RUN \[".*", "-m", "venv"', line))
    assert added[0] < venv, "the account changes least: its layer comes before the venv's"


def fake_base(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\nubuntu:x:1000:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\nubuntu:!:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\nubuntu:!::\n")


def add_user(root: Path, uid: int = RUNTIME_UID) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", str(ADD_USER), RUNTIME_USER, str(uid), RUNTIME_HOME, "/cache"],
                          env={"PATH": os.environ["PATH"], "ROOT": str(root)}, capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the script chowns the account's directories: root only")
def test_the_account_files_are_the_same_on_every_run(tmp_path: Path):
    first, second = tmp_path / "first", tmp_path / "second"
    fake_base(first)
    fake_base(second)
    assert add_user(first).returncode == 0
    time.sleep(1.1)  # useradd would have stamped another second (and day) into the shadow file
    assert add_user(second).returncode == 0
    for name in ("passwd", "group", "shadow", "gshadow"):
        assert (first / "etc" / name).read_bytes() == (second / "etc" / name).read_bytes(), name
    assert (first / "etc/passwd").read_text().splitlines()[-1] == f"sglang:x:{RUNTIME_UID}:{RUNTIME_UID}::/home/sglang:/bin/sh"
    assert (first / "etc/shadow").read_text().splitlines()[-1] == "sglang:!:::::::"
    assert sorted(p.name for p in (first / "etc").iterdir()) == ["group", "gshadow", "passwd", "shadow"]  # no backups
    for directory in (first / "home/sglang", first / "cache"):
        status = directory.stat()
        assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (RUNTIME_UID, RUNTIME_UID, 0o755)


@pytest.mark.parametrize("uid", [RUNTIME_UID, 1000])
def test_a_name_or_id_already_taken_fails_the_step(tmp_path: Path, uid: int):
    root = tmp_path / "root"
    fake_base(root)
    if uid == RUNTIME_UID:
        with (root / "etc/passwd").open("a") as handle:
            handle.write(f"other:x:{RUNTIME_UID}:{RUNTIME_UID}::/home/other:/bin/sh\n")
    before = (root / "etc/passwd").read_bytes()
    result = add_user(root, uid)
    assert result.returncode == 1
    assert result.stderr.strip() == f"add_user.sh: sglang or id {uid} is already in /etc/passwd"
    assert (root / "etc/passwd").read_bytes() == before

