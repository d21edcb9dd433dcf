"""The real stack's build (conftest's `built`), started by the first test of its lane, at low CPU priority.

On 2 cores the suite's tests keep about one core busy each (a cold run on 2026-12-07: 1,306 core-seconds
in 1,361 s of tests outside the modules that use `built`), so the build, which keeps both busy, runs on
what the tests leave instead of ahead of them. Niceness 10 gives the tests the CPU whenever they want
it, so their own timings hardly move. `scripts/test` runs two lanes (conftest's `lane_of`): the engines'
modules in one worker; the others, with this build beside them and the modules that use `built` last,
in the other.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

NICENESS = 10
STOP_GRACE_S = 120  # the builder's own SIGTERM handling removes its containers and candidate tag


class BackgroundBuild:
    """First `make_base`, then the command `argv` in `cwd` at niceness 10, one after the other in one
    thread. `base` and `build` are their futures; `stop` ends a build nobody waited for."""

    def __init__(self, make_base: Callable[[], object], argv: list[str], env: dict, cwd: Path):
        self._process: subprocess.Popen | None = None
        self._stopping = False
        self._starting = threading.Lock()  # stop() and the start never interleave
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="background-build")
        self.base: Future = self._thread.submit(make_base)
        self.build: Future = self._thread.submit(self._build, argv, env, cwd)

    def _build(self, command: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
        self.base.result()  # no base, no build: the base's error is the one to see
        argv = ["nice", "-n", str(NICENESS), *command]
        with self._starting:
            if self._stopping:
                raise RuntimeError("the session ended before the background build started")
            self._process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)
        stdout, stderr = self._process.communicate()
        return subprocess.CompletedProcess(argv, self._process.returncode, stdout, stderr)

    def stop(self) -> None:
        """At the session's end: a build still running (no test asked for it, or the session was cut
        short) gets SIGTERM, then SIGKILL after the grace; the thread is joined either way."""
        with self._starting:
            self._stopping = True
            process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
        self._thread.shutdown(wait=True)
