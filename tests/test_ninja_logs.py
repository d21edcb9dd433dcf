"""The baked FlashInfer modules' ninja logs (builder/runtime/ninja_logs.py): rewritten to the same bytes
whatever order and time the jobs ran in, and still enough for the real ninja to find nothing to do."""

import os
import subprocess
from pathlib import Path

import pytest

from builder.runtime import flashinfer_bake, ninja_logs

EPOCH = 1767225600
BUILD = """rule cc
  command = gcc -MMD -MF $out.d -c $in -o $out
  depfile = $out.d
  deps = gcc
build a.o: cc a.c
build b.o: cc b.c
"""

def _built(directory: Path, order: tuple[str, ...]) -> Path:
    directory.mkdir()
    (directory / "build.ninja").write_text(BUILD)
    (directory / "h.h").write_text("#define X 1\n")
    for name in ("a", "b"):
        (directory / f"{name}.c").write_text('#include "h.h"\nint %s(void) { return X; }\n' % name)
    for target in order:  # one job at a time, in the order given: the logs record that order
        subprocess.run(["ninja", "-j1", f"{target}.o"], cwd=directory, check=True, capture_output=True)
    return directory


def _settle(directory: Path) -> None:
    """What the image does to every file, and what the bake then does to the logs."""
    ninja_logs.normalise_tree(directory, EPOCH * 10**9)
    for path in directory.iterdir():
        os.utime(path, (EPOCH, EPOCH))


def test_two_builds_in_another_order_give_the_same_logs_and_ninja_finds_nothing_to_do(tmp_path):
    first, second = _built(tmp_path / "one", ("a", "b")), _built(tmp_path / "two", ("b", "a"))
    assert (first / ".ninja_deps").read_bytes() != (second / ".ninja_deps").read_bytes()
    for directory in (first, second):
        _settle(directory)
    for log in (".ninja_log", ".ninja_deps"):
        assert (first / log).read_bytes() == (second / log).read_bytes()
    explained = subprocess.run(["ninja", "-n", "-d", "explain"], cwd=first, capture_output=True, text=True, check=True)
    assert "no work to do" in explained.stdout, explained.stdout + explained.stderr


def test_a_changed_input_still_makes_ninja_rebuild_after_the_rewrite(tmp_path):
    """The deps survive the rewrite: a header newer than the image's files is seen."""
    directory = _built(tmp_path / "one", ("a", "b"))
    _settle(directory)
    os.utime(directory / "h.h", (EPOCH + 60, EPOCH + 60))
    explained = subprocess.run(["ninja", "-n"], cwd=directory, capture_output=True, text=True, check=True)
    assert "a.o" in explained.stdout and "b.o" in explained.stdout


@pytest.mark.parametrize("text", ["", "# ninja log v4\n", "# ninja log v7\n1\t2\t3\n"])
def test_a_build_log_ninja_did_not_write_is_refused(text):
    with pytest.raises(ValueError):
        ninja_logs.normalise_build_log(text, 0)


def test_a_deps_log_ninja_did_not_write_is_refused():
    for data in (b"", b"# ninjadeps\n\x03\x00\x00\x00", b"# ninjadeps\n\x04\x00\x00\x00\x08\x00\x00\x00ab\x00\x00\x07\x00"):
        with pytest.raises(ValueError):
            ninja_logs.normalise_deps_log(data, 0)


def test_the_bake_settles_what_would_make_two_bakes_differ(tmp_path):
    module = tmp_path / "0.7.2" / "120f" / "cached_ops" / "m"
    module.mkdir(parents=True)
    (tmp_path / "0.7.2" / "120f" / "flashinfer_jit.log").write_text("2026-12-02 14:48:43,109 - INFO - building m\n")
    (module / ".ninja_log").write_text("# ninja log v7\n5\t900\t1796222955943536410\t/c/m.so\tcac8dd858750d\n")
    flashinfer_bake.settle(tmp_path, EPOCH)
    assert not list(tmp_path.rglob("flashinfer_jit.log"))
    assert (module / ".ninja_log").read_text() == f"# ninja log v7\n0\t0\t{EPOCH * 10**9}\t/c/m.so\tcac8dd858750d\n"


def test_the_bake_needs_the_builds_epoch(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    with pytest.raises(RuntimeError, match="SOURCE_DATE_EPOCH"):
        flashinfer_bake.source_date_epoch()


def test_the_bake_lets_ninja_run_jobs_in_parallel(tmp_path, monkeypatch):
    """Neither the pids nor the order jobs finish in reach the bytes (stable_nvcc, the sorted logs), so
    the bake sets no MAX_JOBS and drops one from the step's environment; the CUDA_HOME's bin comes first."""
    monkeypatch.setenv("MAX_JOBS", "1")
    env = flashinfer_bake.build_environment({"target_arch": ["12.0"], "serve": {}}, tmp_path)
    assert "MAX_JOBS" not in env
    assert env["PATH"].split(":")[0] == str(tmp_path / "bin") and env["CUDA_HOME"] == str(tmp_path)
