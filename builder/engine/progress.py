"""Build progress: step and elapsed time on a terminal, plain prefixed lines under CI=true."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import TextIO

_STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


class Progress:
    def __init__(self, stream: TextIO, interactive: bool):
        self.stream = stream
        self.interactive = interactive
        self.started = time.monotonic()
        self._status_shown = False

    @classmethod
    def for_environment(cls) -> "Progress":
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        return cls(sys.stderr, interactive=sys.stderr.isatty() and not ci)

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:7.1f}s"

    def _clear_status(self) -> None:
        if self._status_shown:
            self.stream.write("\r\033[K")
            self._status_shown = False

    def line(self, text: str) -> None:
        """One line of engine output. A terminal keeps a live status line for the current step."""
        text = text.rstrip("\n")
        step = _STEP.match(text)
        if not self.interactive:
            self.stream.write(f"[{self._elapsed()}] {text}\n")
        elif step:
            self._clear_status()
            self.stream.write(f"[{self._elapsed()}] step {step.group(1)}/{step.group(2)}: {step.group(3)[:100]}\n")
        else:
            self._clear_status()
            self.stream.write(f"\r  {text[:120]}")
            self._status_shown = True
        self.stream.flush()

    def stage(self, text: str) -> None:
        self._clear_status()
        self.stream.write(f"[{self._elapsed()}] == {text}\n")
        self.stream.flush()

    def block(self, text: str) -> None:
        self._clear_status()
        self.stream.write(text.rstrip("\n") + "\n")
        self.stream.flush()
