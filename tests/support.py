"""Helpers the test modules share (not a test module itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builder.publish.resolve import PLATFORM, Distribution, Resolution

REPO = Path(__file__).resolve().parent.parent
IMAGE = "sha256:" + "1" * 64
OTHER_IMAGE = "sha256:" + "2" * 64


def run_builder(*args: str, env: dict | None = None, cwd: Path = REPO,
                timeout: int = 3600) -> subprocess.CompletedProcess:
    """The `builder` command line, as `python -m builder.cli` run from `cwd` (a clone runs its own code)."""
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def dist(name, version, group, source="default index", url=None, hashes=None):
    """A locked distribution with made-up hashes: what `builder lock` records, without an index."""
    sha = (name.encode().hex() * 64)[:64]
    return Distribution(name=name, version=version, sha256=sha, wheel=f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                        hashes=tuple(hashes or (sha,)), source=source, group=group, url=url)


def resolution_of(stack, *extra):
    """A resolution of exactly the stack's pins (plus `extra`), as a resolver would return it."""
    indexes = tuple(dict.fromkeys(p.index for p in stack.packages if p.index))
    distributions = [dist(p.name, p.version, group, source=p.url or p.index or "default index", url=p.url)
                     for group in ("torch", "kernels", "sglang") for p in stack.packages_in_group(group)]
    return Resolution(stack.python, PLATFORM, indexes, "unsafe-best-match" if indexes else "first-index",
                      tuple(sorted([*distributions, *extra], key=lambda d: d.name)))


def bench_report(mode="eagle3", tok_s=55.0, verdict="pass", stack="sglang-0.5.9-cu128"):
    """Shaped as builder/runtime/bench.py writes it (schema 1)."""
    return {"schema": 1, "stack": stack, "mode": mode, "model": "/models/test", "gpus": ["NVIDIA RTX PRO 6000 Blackwell"] * 8,
            "tok_s": tok_s, "ttft_ms": 210.0, "reference_tok_s": 54.1, "verdict": verdict,
            "workload": {"concurrency": 1, "input_len": 1024, "output_len": 512}}


