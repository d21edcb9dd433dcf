"""patches: every patch of the series is in the installed files, and compiled.

By content, not by a marker: for each hunk of each patch, the hunk's new side
(its context and added lines, in order) must appear as a block in the file
Python imports. A reverted or unapplied patch leaves the old side there
instead. "Compiled": the file compiles, and its .pyc, if any, was written from
this very source (a stale unchecked .pyc would run the unpatched code).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from builder.runtime import apply_patch
from builder.runtime.smoke import report
from builder.runtime.smoke.env import Environment

_PYC_HASH_BASED = 0x1


def find_block(lines: list[str], block: list[str]) -> int:
    """Index where `block` starts as consecutive lines of `lines` (trailing whitespace ignored), -1."""
    if not block:
        return 0
    wanted = [line.rstrip() for line in block]
    have = [line.rstrip() for line in lines]
    for start in range(len(have) - len(wanted) + 1):
        if have[start:start + len(wanted)] == wanted:
            return start
    return -1


def run(env: Environment) -> list[report.Result]:
    patches = env.info["patches"]
    if not patches:
        return [report.skipped("patches", "the stack has no patches")]
    return [check_patch(patch) for patch in patches]


def check_patch(patch: dict) -> report.Result:
    check = f"patches.{patch['package']}/{patch['name']}"
    try:
        diffs = apply_patch.read_patch(patch["path"])  # the reader the patch layer applied it with
    except OSError as error:
        return report.failed(check, f"cannot read the patch {patch['path']}: {error.strerror}")
    except apply_patch.PatchError as error:
        return report.failed(check, f"{patch['path']}: {'; '.join(error.problems)}")
    problems, hunks = [], 0
    for diff in diffs:
        target = installed_file(diff.path)
        if target is None:
            problems.append(f"{diff.path} is not installed")
            continue
        with open(target, encoding="utf-8") as handle:
            source = handle.read()
        lines = source.splitlines()
        for hunk in diff.hunks:
            hunks += 1
            if find_block(lines, list(hunk.new_side)) < 0:
                problems.append(f"{diff.path} hunk #{hunk.number} ({hunk.header}) is not in {target}")
        if target.endswith(".py"):
            problem = bytecode_problem(target, source)
            if problem:
                problems.append(problem)
    if problems:
        return report.failed(check, "; ".join(problems))
    return report.passed(check, f"{hunks} hunks in {len(diffs)} files present; bytecode current")


def installed_file(relative: str) -> str | None:
    """The file Python would import for a site-packages-relative path: first on sys.path."""
    for entry in sys.path:
        candidate = os.path.join(entry or ".", relative)
        if os.path.isfile(candidate):
            return candidate
    return None


def bytecode_problem(path: str, source: str) -> str | None:
    """Why the module's bytecode is not current, or None when it is."""
    try:
        compile(source, path, "exec")
    except SyntaxError as error:
        return f"{path} does not compile: {error.msg} (line {error.lineno})"
    cached = importlib.util.cache_from_source(path)
    try:
        with open(cached, "rb") as handle:
            header = handle.read(16)
    except OSError:
        return f"{path} has no bytecode ({os.path.relpath(cached, os.path.dirname(path))})"
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return f"{cached} was written by another Python version"
    flags = int.from_bytes(header[4:8], "little")
    if flags & _PYC_HASH_BASED:
        with open(path, "rb") as handle:
            current = importlib.util.source_hash(handle.read())
        if header[8:16] != current:
            return f"{cached} was compiled from other source (stale hash)"
        return None
    stat = os.stat(path)
    if (int.from_bytes(header[8:12], "little") != int(stat.st_mtime) & 0xFFFFFFFF
            or int.from_bytes(header[12:16], "little") != stat.st_size & 0xFFFFFFFF):
        return f"{cached} was compiled from other source (stale timestamp)"
    return None
