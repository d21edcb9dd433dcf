"""Where an import's blobs are staged (builder/engine/staging.py): in memory only when they fit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from builder.engine import staging


def meminfo(tmp_path: Path, available_kib: int) -> Path:
    path = tmp_path / f"meminfo-{available_kib}"
    path.write_text(f"MemTotal:       99999999 kB\nMemFree:        1 kB\nMemAvailable:   {available_kib} kB\n")
    return path


def test_memory_is_used_only_with_room_for_the_layers_and_the_reserve(tmp_path):
    memory_fs = tmp_path / "fs"
    memory_fs.mkdir()
    free = os.statvfs(memory_fs).f_bavail * os.statvfs(memory_fs).f_frsize
    plenty = meminfo(tmp_path, (staging.RESERVE_BYTES + free) // 1024 + 1)
    assert staging.fits_in_memory(free // 2, memory_fs, plenty)
    assert not staging.fits_in_memory(free + (1 << 30), memory_fs, plenty)  # more than the filesystem holds
    tight = meminfo(tmp_path, (staging.RESERVE_BYTES + free // 2) // 1024 - 1)
    assert not staging.fits_in_memory(free // 2, memory_fs, tight)  # it would eat into the reserve
    assert not staging.fits_in_memory(1, memory_fs, tmp_path / "no-meminfo")
    assert not staging.fits_in_memory(1, tmp_path / "missing", plenty)
    assert staging.available_memory(plenty) == ((staging.RESERVE_BYTES + free) // 1024 + 1) * 1024


def test_the_staging_directory_is_made_for_the_import_and_removed_after(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "fits_in_memory", lambda need, memory_fs: need < 100)
    with staging.staging_environment(10, tmp_path) as env:
        made = Path(env["TMPDIR"])
        assert made.parent == tmp_path and made.is_dir() and made.name.startswith(f"builder-staging-{os.getpid()}-")
        (made / "staged-blob").write_bytes(b"x")
    assert not made.exists()
    with staging.staging_environment(1000, tmp_path) as env:
        assert env.get("TMPDIR") == os.environ.get("TMPDIR")  # too big: where the engine always stages
    assert list(tmp_path.iterdir()) == []


def test_a_dead_builds_staging_is_swept_and_a_live_ones_is_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / f"builder-staging-{dead}-0badf00d").mkdir()
    (tmp_path / f"builder-staging-{os.getpid()}-0badf00d").mkdir()
    (tmp_path / "someone-elses").mkdir()
    assert staging.sweep(tmp_path) == [f"builder-staging-{dead}-0badf00d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"builder-staging-{os.getpid()}-0badf00d", "someone-elses"]
