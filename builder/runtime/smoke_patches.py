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
import re
import sys
from dataclasses import dataclass, field

try:
    from . import smoke_report as report
    from .smoke_env import Environment
except ImportError:  # run as a script from /opt/builder/runtime
    import smoke_report as report
    from smoke_env import Environment

_PYC_HASH_BASED = 0x1
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    header: str
    new_side: list[str] = field(default_factory=list)


@dataclass
class FileDiff:
    path: str  # as named on the "+++" line, with its first component ("b/") removed
    hunks: list[Hunk] = field(default_factory=list)


def parse_patch(text: str) -> list[FileDiff]:
    """The files and hunks of a unified diff (the -p1 form every patch of the series uses).

    A hunk's extent comes from its header's line counts, so a removed line that
    reads "-- x" is never mistaken for the next file's "--- " header.
    """
    files: list[FileDiff] = []
    hunk: Hunk | None = None
    old_left = new_left = 0
    for line in text.splitlines():
        if hunk is not None and (old_left > 0 or new_left > 0):
            tag, body = line[:1], line[1:]
            if tag in (" ", ""):  # context; an empty line is context whose space was stripped
                hunk.new_side.append(body)
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "+":
                hunk.new_side.append(body)
                new_left -= 1
            elif tag == "-":
                old_left -= 1
            continue  # "\\ No newline at end of file" and the like
        match = _HUNK_HEADER.match(line)
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            files.append(FileDiff(name.split("/", 1)[1] if "/" in name else name))
            hunk = None
        elif match and files:
            hunk = Hunk(line)
            files[-1].hunks.append(hunk)
            old_left = int(match.group(2) or 1)
            new_left = int(match.group(4) or 1)
    return files


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
        with open(patch["path"], encoding="utf-8") as handle:
            diffs = parse_patch(handle.read())
    except OSError as error:
        return report.failed(check, f"cannot read the patch {patch['path']}: {error.strerror}")
    if not diffs:
        return report.failed(check, f"{patch['path']} holds no file diffs")
    problems, hunks = [], 0
    for diff in diffs:
        target = installed_file(diff.path)
        if target is None:
            problems.append(f"{diff.path} is not installed")
            continue
        with open(target, encoding="utf-8") as handle:
            source = handle.read()
        lines = source.splitlines()
        for number, hunk in enumerate(diff.hunks, 1):
            hunks += 1
            if find_block(lines, hunk.new_side) < 0:
                problems.append(f"{diff.path} hunk #{number} ({hunk.header}) is not in {target}")
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
