"""Image names: an immutable tag derived from the resolved inputs, a moving stack tag, a candidate tag.

The inputs hash covers the rendered Dockerfile and every file it COPYs from the
context, so changing a pin, a lock hash, a patch or an in-image tool gives a
new immutable tag, and the same inputs always give the same one.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from builder.render import REPO_ROOT, stack_dir
from builder.stack import Stack

_COPY = re.compile(r"^COPY\s+(?:--\S+\s+)*(\S+)\s+\S+\s*$")


def copied_sources(dockerfile: str) -> list[str]:
    """Context paths the Dockerfile's COPY instructions read, in order."""
    return [m.group(1) for m in map(_COPY.match, dockerfile.splitlines()) if m]


def _files_under(root: Path, source: str) -> list[Path]:
    path = root / source
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [path]


def inputs_hash(stack: Stack, root: Path | None = None) -> str:
    """sha256 over the base reference, SOURCE_DATE_EPOCH, the Dockerfile and each copied file."""
    root = root or REPO_ROOT
    dockerfile = (root / stack_dir(stack) / "Dockerfile").read_text(encoding="utf-8")
    digest = hashlib.sha256()
    digest.update(f"base={stack.base.reference}\nepoch={stack.source_date_epoch}\n".encode())
    digest.update(dockerfile.encode())
    for source in copied_sources(dockerfile):
        for path in _files_under(root, source):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def _short_name(stack: Stack) -> str:
    """'sglang-0.5.9-cu130' in repository 'sglang' -> '0.5.9-cu130'."""
    return stack.name.removeprefix(stack.repository + "-")


def immutable_tag(stack: Stack, hash_hex: str) -> str:
    return f"{stack.repository}:{_short_name(stack)}-{hash_hex[:12]}"


def moving_tag(stack: Stack) -> str:
    return f"{stack.repository}:{_short_name(stack)}"


def candidate_tag(stack: Stack, hash_hex: str) -> str:
    """Where a build lands until its smoke test passes; removed either way."""
    return f"{stack.repository}-candidate:{_short_name(stack)}-{hash_hex[:12]}"
