"""The suite's background build (tests/background_build.py): low priority, after the base, stoppable."""

from __future__ import annotations

import os
import subprocess
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


def test_scripts_test_keeps_each_lane_on_one_worker():
    """Under `-n 2 --dist loadgroup` (scripts/test) a module's tests all run on one worker, and a module
    of the engines' lane on the other worker from one of the build's lane. With pytest 9.2 the groups
    fell apart: xdist names a group by a node id that pytest no longer reads."""
    modules = {"tests/test_render.py": "build", "tests/test_base_digest.py": "engines"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                             "loadgroup", "-v", *modules], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"})
    assert result.returncode == 0, result.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            nodeid = line.split(" PASSED ", 1)[1].strip()
            module, _, rest = nodeid.partition("::")
            assert rest.endswith("@" + modules[module]), line
            workers.setdefault(module, set()).add(line.split("]", 1)[0])
    assert set(workers) == set(modules) and all(len(names) == 1 for names in workers.values()), workers
    assert workers["tests/test_render.py"] != workers["tests/test_base_digest.py"]
