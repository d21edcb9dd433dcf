"""The suite's background build (tests/background_build.py): low priority, after the base, stoppable."""

from __future__ import annotations

import os
import sys
import time

import pytest

from background_build import NICENESS, BackgroundBuild
from checkouts import REPO

PRINT_NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]


def test_the_build_runs_after_the_base_at_low_priority():
    order = []
    build = BackgroundBuild(lambda: order.append("base") or "the base", PRINT_NICENESS, {}, REPO)
    try:
        assert build.base.result(timeout=60) == "the base"
        result = build.build.result(timeout=60)
    finally:
        build.stop()
    assert order == ["base"]
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == os.nice(0) + NICENESS  # nice(1) adds to the caller's


def test_a_failed_base_is_the_builds_error_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"

    def fail():
        raise AssertionError("builder base failed")

    build = BackgroundBuild(fail, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], {}, REPO)
    try:
        with pytest.raises(AssertionError, match="builder base failed"):
            build.build.result(timeout=60)
    finally:
        build.stop()
    assert not marker.exists()


def test_stop_ends_a_build_nobody_waited_for(tmp_path):
    started = tmp_path / "started"
    sleeper = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(600)"
    build = BackgroundBuild(lambda: None, [sys.executable, "-c", sleeper], {}, REPO)
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists()
    build.stop()
    assert build.build.result(timeout=1).returncode == -15  # SIGTERM, not the sleep's end
