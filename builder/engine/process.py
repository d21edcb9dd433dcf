"""Running an engine's command line: argument lists only, output streamed line by line, a short tail
kept for the failure message, and Ctrl-C passed on so the child stops before we return."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from builder.errors import BuildFailure

TAIL_LINES = 15
# buildah prints "STEP 3/9: RUN ..."; docker's BuildKit plain output prints "#7 [3/9] RUN ...".
_STEP = re.compile(r"^(?:STEP \d+/\d+: .*|#\d+ \[(?:[^\]]+ )?\d+/\d+\] .*)$")


class StepFailure(BuildFailure):
    def __init__(self, step: str, returncode: int, tail: Sequence[str], what: str):
        self.step = step
        self.returncode = returncode
        self.tail = tuple(tail)
        where = f" at {step}" if step else ""
        lines = "".join(f"\n  | {line}" for line in tail)
        super().__init__(f"{what} failed{where} (exit status {returncode}); last output:{lines}")


def run_streaming(
    argv: Sequence[str],
    what: str,
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Run argv; return all output lines. Raise StepFailure naming the last step seen on failure."""
    lines: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    step = ""
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=dict(env) if env is not None else None,
    )
    try:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            tail.append(line)
            if _STEP.match(line):
                step = line
            if on_line:
                on_line(line)
        returncode = process.wait()
    except BaseException:
        # Ctrl-C (or a failing callback): stop the child and wait, so it writes nothing after we go.
        _stop(process)
        raise
    if returncode != 0:
        raise StepFailure(step, returncode, tail, what)
    return lines


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_quiet(argv: Sequence[str], what: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    """Run a short command; return stdout. Raise BuildFailure with its stderr on failure."""
    result = subprocess.run(
        list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, errors="replace", cwd=cwd,
        env=dict(env) if env is not None else None,
    )
    if result.returncode != 0:
        message = (result.stderr.strip() or result.stdout.strip()).splitlines()
        detail = message[-1] if message else f"exit status {result.returncode}"
        raise BuildFailure(f"{what} failed: {detail}")
    return result.stdout
