"""Run the server under supervision until it is ready, then until it ends.

- The server gets its own process group (a new session), so one signal reaches
  it and every worker it forks, and one check tells whether any is left.
- Its stdout and stderr are merged, echoed line by line and kept in a log file.
- Ready: the ready log line, or GET /health answering 200.
- Waiting is progress-aware: any new log line (a shard bar only when its count
  moves) resets the stall clock; the start fails after `stall_s` without
  progress or `start_s` in total, naming where it stuck.
- A Traceback before ready fails at once (after a moment to collect the rest of
  it); so does an exit before ready.
- SIGTERM, SIGINT and SIGHUP are forwarded to the group; after `stop_s` the group is
  killed. Every child is reaped with waitpid(-1), which also reaps orphans
  re-parented to us when we run as PID 1 in a container.

waitpid(-1) would steal the status of any other child, so nothing else may run
subprocesses while a Supervisor is running; the bench job uses HTTP only.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from builder.runtime.serve import health
from builder.runtime.serve.errors import (
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    PreflightError,
    ServerDied,
    StartupFailed,
    StartupStalled,
)
from builder.runtime.serve.progress import StartupProgress, parse_gen_throughput

TAIL_LINES = 40
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # HUP: a closed terminal
LINE_BREAK = re.compile(rb"\r\n|\r|\n")  # tqdm redraws with \r: each redraw is a line
_EOF = object()


@dataclasses.dataclass(frozen=True)
class Timeouts:
    stall_s: float = 300.0  # no progress for this long while starting: give up
    start_s: float = 3600.0  # total cap on starting, progress or not
    stop_s: float = 30.0  # after forwarding a stop signal, SIGKILL the group
    traceback_grace_s: float = 2.0  # collect the rest of a traceback before stopping
    health_interval_s: float = 1.0
    health_timeout_s: float = 5.0  # /health generates one token once the server is up
    status_interval_s: float = 30.0  # "still starting" lines while waiting


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def server_url(host: str, port: int) -> str:
    """Where to reach the server from here: a wildcard listen address over loopback."""
    connect = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in connect:
        connect = f"[{connect}]"
    return f"http://{connect}:{port}"


def health_url(host: str, port: int) -> str:
    return server_url(host, port) + "/health"


def probe_health(url: str, timeout_s: float) -> bool:
    """GET `url` answers 200, asked as `entrypoint health` asks: never through a proxy."""
    return health.probe(url, timeout_s) is None


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


class LogPump(threading.Thread):
    """Reads the server's merged output: echo, append to the log, queue for the supervisor."""

    def __init__(self, fd: int, log_file, echo, lines: queue.Queue, redact: Callable[[str], str] | None = None):
        super().__init__(name="server-log", daemon=True)
        self.fd = fd
        self.log_file = log_file
        self.echo = echo
        self.lines = lines
        self.redact = redact  # hides the API key, which SGLang logs with its ServerArgs

    def run(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            *complete, pending = LINE_BREAK.split(pending + chunk)
            self._emit(complete)
        if pending:
            self._emit([pending])
        self.lines.put(_EOF)

    def _emit(self, raw_lines: list[bytes]) -> None:
        raw_lines = [raw for raw in raw_lines if raw]  # "\rbar\n" from tqdm leaves an empty piece
        if not raw_lines:
            return
        text = [raw.decode("utf-8", errors="replace") for raw in raw_lines]
        if self.redact:
            text = [self.redact(line) for line in text]
        block = "".join(line + "\n" for line in text)
        for stream in (self.echo, self.log_file):
            try:
                stream.write(block)
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed terminal must not stop the log
        for line in text:
            self.lines.put(line)


class Supervisor:
    def __init__(
        self,
        command: list[str],
        env: dict,
        log_path: str,
        health: str,
        timeouts: Timeouts = Timeouts(),
        out=None,
        err=None,
        clock: Callable[[], float] = time.monotonic,
        redact: Callable[[str], str] | None = None,
    ):
        self.command = command
        self.redact = redact
        self.env = env
        self.log_path = log_path
        self.health = health
        self.timeouts = timeouts
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.clock = clock
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.gen_throughputs: list[float] = []  # from the server's decode log lines
        self.progress: StartupProgress | None = None
        self._lines: queue.Queue = queue.Queue()
        self._pump: LogPump | None = None
        self._log_file = None
        self._signals: list[int] = []
        self._old_handlers: dict = {}

    # ---- public -----------------------------------------------------------------------

    def run(self, job: Callable[[], int] | None = None, display: list[str] | None = None) -> int:
        """Start, wait for ready, then run `job` (bench) or watch the server until it ends."""
        self._install_handlers()
        try:
            self._start(display or self.command)
            how = self._wait_ready()
            elapsed = self.clock() - self.progress.started_at
            self.say(f"server ready after {elapsed:.0f} s ({how}); log: {self.log_path}")
            if job is None:
                return self._watch()
            return self._run_job(job)
        except _Stopped as stopped:
            name = signal.Signals(stopped.signum).name
            self.say(f"received {name}: stopping the server's process group")
            self._stop_group(stopped.signum)
            return EXIT_SIGNAL_BASE + stopped.signum
        except (StartupFailed, StartupStalled, ServerDied) as error:
            self._stop_group(signal.SIGTERM)
            self._drain(0.5)
            error.log_tail = tuple(self.tail)
            error.log_path = self.log_path
            raise
        finally:
            self._stop_group(signal.SIGTERM)
            self._restore_handlers()
            if self._pump is not None:
                self._pump.join(timeout=2.0)
            if self._log_file is not None:
                self._log_file.close()

    def say(self, message: str) -> None:
        self.err.write(f"entrypoint: {message}\n")
        self.err.flush()

    # ---- start and wait ----------------------------------------------------------------

    def _start(self, display: list[str]) -> None:
        try:
            os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
            if os.path.exists(self.log_path):  # keep the previous run's log: it may hold the last crash
                os.replace(self.log_path, self.log_path + ".1")
            self._log_file = open(self.log_path, "w", encoding="utf-8")
        except OSError as error:
            raise PreflightError(f"cannot write the server log {self.log_path}: {error.strerror}") from None
        self._log_file.write("# entrypoint: " + " ".join(display) + "\n")
        self._log_file.flush()
        self.say("starting: " + " ".join(display))
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own session and process group: pgid == pid
        )
        self.progress = StartupProgress(self.clock())
        self._pump = LogPump(self.proc.stdout.fileno(), self._log_file, self.out, self._lines, self.redact)
        self._pump.start()

    def _wait_ready(self) -> str:
        progress = self.progress
        limits = self.timeouts
        next_health = self.clock()
        next_status = self.clock() + limits.status_interval_s
        traceback_deadline = None
        while True:
            self._step(0.2)
            now = self.clock()
            if progress.ready:
                return "ready log line"
            if self.returncode is not None:
                self._drain(1.0)
                cause = "raised an exception and " if progress.traceback_seen else ""
                raise StartupFailed(
                    f"server {cause}{describe_exit(self.returncode)} before it was ready"
                )
            if progress.traceback_seen:
                if traceback_deadline is None:
                    traceback_deadline = now + limits.traceback_grace_s
                elif now >= traceback_deadline:
                    raise StartupFailed(
                        f"server raised an exception while starting: {self.tail[-1]!r}"
                    )
                continue
            if now >= next_health:
                if probe_health(self.health, limits.health_timeout_s):
                    return "/health answered 200"
                next_health = self.clock() + limits.health_interval_s
            if progress.idle_for(now) >= limits.stall_s:
                raise StartupStalled(progress.stall_message(now))
            if now - progress.started_at >= limits.start_s:
                raise StartupStalled(
                    f"not ready after {limits.start_s:.0f} s (the total cap), {progress.where()}"
                )
            if now >= next_status:
                self.say(progress.status(now))
                next_status = now + limits.status_interval_s

    # ---- after ready -------------------------------------------------------------------

    def _watch(self) -> int:
        while True:
            self._step(0.5)
            if self.returncode is not None:
                self._drain(1.0)
                if self.returncode == 0:
                    self.say("server exited with status 0")
                    return EXIT_OK
                raise ServerDied(f"server {describe_exit(self.returncode)} after it was ready")

    def _run_job(self, job: Callable[[], int]) -> int:
        outcome: dict = {}

        def target() -> None:
            try:
                outcome["code"] = job()
            except BaseException as error:  # handed to the main thread below
                outcome["error"] = error

        worker = threading.Thread(target=target, name="bench", daemon=True)
        worker.start()
        while worker.is_alive():
            self._step(0.2)
            if self.returncode is not None:
                self._drain(1.0)
                raise ServerDied(f"server {describe_exit(self.returncode)} during the benchmark")
        self.say("job finished: stopping the server")
        self._stop_group(signal.SIGTERM)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["code"]

    # ---- plumbing ----------------------------------------------------------------------

    def _step(self, timeout: float) -> None:
        """Take in log lines for up to `timeout`, reap children, act on a pending signal."""
        self._take_lines(timeout)
        self._reap()
        if self._signals:
            raise _Stopped(self._signals.pop(0))

    def _take_lines(self, timeout: float) -> bool:
        """Feed queued lines to the trackers; False once the pump reached end of output."""
        deadline = self.clock() + timeout
        while True:
            remaining = deadline - self.clock()
            try:
                line = self._lines.get(timeout=max(remaining, 0.0)) if remaining > 0 else self._lines.get_nowait()
            except queue.Empty:
                return True
            if line is _EOF:
                self._lines.put(_EOF)  # stay at end of output for later calls
                return False
            self.tail.append(line)
            self.progress.feed(line, self.clock())
            value = parse_gen_throughput(line)
            if value is not None:
                self.gen_throughputs.append(value)

    def _drain(self, timeout: float) -> None:
        """Collect what the server printed last, until end of output or `timeout`."""
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            if not self._take_lines(0.05):
                return

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc is not None and pid == self.proc.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.returncode  # Popen must not wait for it again

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_group(self, signum: int) -> None:
        """Forward `signum` to the whole group, wait `stop_s`, then SIGKILL what is left."""
        if self.proc is None or not self._group_alive():
            self._reap()
            return
        self._signal_group(signum)
        deadline = self.clock() + self.timeouts.stop_s
        pending_before = len(self._signals)
        while self._group_alive() and self.clock() < deadline:
            self._take_lines(0.1)
            self._reap()
            if len(self._signals) > pending_before:  # a second signal: stop waiting
                break
        if self._group_alive():
            self.say("process group still running: sending SIGKILL")
            self._signal_group(signal.SIGKILL)
            deadline = self.clock() + 10.0
            while self._group_alive() and self.clock() < deadline:
                self._take_lines(0.05)
                self._reap()
        self._reap()

    def _install_handlers(self) -> None:
        def record(signum, _frame):
            self._signals.append(signum)

        for signum in FORWARDED_SIGNALS:
            self._old_handlers[signum] = signal.signal(signum, record)

    def _restore_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()
