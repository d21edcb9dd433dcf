"""Helpers the test modules share (not a test module itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_builder(*args: str, env: dict | None = None, cwd: Path = REPO,
                timeout: int = 3600) -> subprocess.CompletedProcess:
    """The `builder` command line, as `python -m builder.cli` run from `cwd` (a clone runs its own code)."""
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
