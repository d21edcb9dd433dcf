"""Run the real entrypoint against the stand-in server, for the tests.

The entrypoint's command line is the production one (`python -m
sglang.launch_server ...`); only the environment differs: this folder comes
first on PYTHONPATH (so `sglang` is the stand-in) and bin/ first on PATH (so
`nvidia-smi` is the stand-in), and BUILDER_STACK_JSON names the fixture.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

STANDIN = Path(__file__).resolve().parent
REPO = STANDIN.parents[1]
FIXTURE = STANDIN / "stack.json"
ENTRYPOINT = [sys.executable, "-m", "builder.runtime.serve.entrypoint"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_model(root: Path, name: str = "model") -> str:
    model = root / name
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "kimi_k25"}))
    return str(model)


def standin_env(stack_json: Path = FIXTURE, **standin) -> dict:
    """The caller's environment with the stand-ins selected; STANDIN_<KEY>=value per keyword."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("STANDIN_", "ENTRYPOINT_", "CUDA_VISIBLE_DEVICES", "BUILDER_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(REPO)])
    env["PATH"] = os.pathsep.join([str(STANDIN / "bin"), env.get("PATH", "")])
    env["BUILDER_STACK_JSON"] = str(stack_json)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({f"STANDIN_{key.upper()}": str(value) for key, value in standin.items()})
    return env


def launch_args(tmp: Path, port: int, mode: str = "baseline", model: str | None = None, **limits) -> list[str]:
    """Launch options shared by serve and bench: loopback, a private cache, short timeouts."""
    args = [
        "--mode", mode,
        "--model", model or make_model(tmp),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--cache-dir", str(tmp / "cache"),
        "--stall-timeout", str(limits.get("stall", 3)),
        "--start-timeout", str(limits.get("start", 60)),
        "--stop-timeout", str(limits.get("stop", 3)),
    ]  # fmt: skip
    if mode == "eagle3":
        args += ["--draft-model", make_model(tmp, "draft")]
    return args


def run_entrypoint(args: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ENTRYPOINT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


class Running:
    """An entrypoint started in the background, its stderr collected as it arrives."""

    def __init__(self, args: list[str], env: dict, command: list[str] | None = None):
        self.proc = subprocess.Popen(
            command or [*ENTRYPOINT, *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._collect, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._collect, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def wait_for(self, pattern: str, timeout: float = 30, stream: str = "stderr") -> str:
        """The first line of `stream` matching `pattern`; fails if the process ends or time runs out."""
        regex = re.compile(pattern)
        lines = self.stderr if stream == "stderr" else self.stdout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(lines):
                if regex.search(line):
                    return line
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the readers finish
                for line in list(lines):
                    if regex.search(line):
                        return line
                raise AssertionError(f"exited {self.proc.returncode} before {pattern!r}:\n{self.text()}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text()}")

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def text(self) -> str:
        return "".join(self.stderr)

    def output(self) -> str:
        return "".join(self.stdout)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def read_record(path: Path) -> dict:
    return json.loads(path.read_text())
