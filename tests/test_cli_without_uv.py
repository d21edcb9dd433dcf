"""`builder` where uv is not installed: only resolving needs it, so `--help` and the other commands work,
and a resolution says in one line what is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.config.matrix import load_matrix
from builder.errors import UserError
from builder.lock import resolve

REPO = Path(__file__).resolve().parent.parent
NO_UV_PATH = "/usr/bin:/bin"
# uv's package hidden from the import system (None in sys.modules makes `import uv` fail), as where
# builder runs from a Python without it.
WITHOUT_UV = "import sys; sys.modules['uv'] = None; from builder.cli.main import main; sys.exit(main(sys.argv[1:]))"


def builder_without_uv(*args: str) -> subprocess.CompletedProcess:
    assert shutil.which("uv", path=NO_UV_PATH) is None, f"uv is on {NO_UV_PATH}: pick a PATH without it"
    return subprocess.run([sys.executable, "-c", WITHOUT_UV, *args], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": NO_UV_PATH, "PYTHONPATH": str(REPO)}, timeout=120)


def test_help_lists_the_commands_without_uv():
    result = builder_without_uv("--help")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "lock" in result.stdout and "build" in result.stdout


def test_a_command_that_resolves_nothing_runs_without_uv():
    result = builder_without_uv("matrix")
    assert result.returncode == 0, result.stderr
    assert "sglang-0.5.9-cu128" in result.stdout


def test_resolving_without_uv_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "uv", None)
    stack = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
    with pytest.raises(UserError, match=r"^resolving a stack's pins needs uv, which is not installed here"):
        resolve.resolve(stack)
