"""The rendered Dockerfile read as the write-once builder's plan (builder/engine/write_once.py).

The Dockerfile stays the one spec: an engine builds it, and the builder runs the same instructions
itself. Only the instructions the templates emit are accepted, each in the one form they emit it
(exec-form JSON for RUN, ENTRYPOINT and CMD; `key=value` words for ENV and LABEL; a read-only bind
mount as RUN's only option); anything else is refused by its line, never guessed at.

Each step also carries the history text buildah 1.28 writes for it, in the canonical form
(builder/oci/canonical.py drops the source digests), so an image the builder writes and the engine's
image in canonical form have the same config and the same id.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import BuildFailure

_MOUNT = re.compile(r"--mount=type=bind,source=([A-Za-z0-9_.-]+),target=(/[A-Za-z0-9_./-]+),ro$")
_ARG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?$")
_METADATA = ("ENV", "LABEL", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD")


@dataclass(frozen=True)
class Step:
    """One instruction: its keyword, its arguments as parsed, and its history text (created_by)."""

    keyword: str
    line: int
    created_by: str
    empty_layer: bool
    argv: tuple[str, ...] = ()  # RUN, ENTRYPOINT, CMD
    sources: tuple[str, ...] = ()  # COPY, relative to the context
    destination: str = ""  # COPY
    mounts: tuple[tuple[str, str], ...] = ()  # RUN: (context source, target)
    pairs: tuple[tuple[str, str], ...] = ()  # ENV, LABEL
    value: str = ""  # WORKDIR, USER, EXPOSE; ARG: the name


@dataclass(frozen=True)
class Plan:
    base: str
    steps: tuple[Step, ...]
    build_args: dict[str, str] = field(default_factory=dict)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with comments and blanks left out and each continuation
    ("\\" at the end of a line) joined as buildah joins it: the backslash and newline removed, the
    spaces around them kept."""
    lines, pending, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        lines.append((start, pending + raw))
        pending = ""
    if pending:
        raise BuildFailure(f"Dockerfile:{start}: the instruction ends in a continuation")
    return lines


def _json_argv(text: str, where: str) -> tuple[str, ...]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise BuildFailure(f"{where}: expected the exec form, a JSON list of strings")
    return tuple(value)


def _pairs(text: str, where: str) -> tuple[tuple[str, str], ...]:
    try:
        words = shlex.split(text, posix=True)
    except ValueError as error:
        raise BuildFailure(f"{where}: {error}") from None
    pairs = []
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise BuildFailure(f"{where}: expected key=value words")
        pairs.append((key, value))
    return tuple(pairs)


def _run(rest: str, where: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    mounts = []
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        match = _MOUNT.match(option)
        if match is None:
            raise BuildFailure(f"{where}: only a read-only bind mount of the context is accepted, not {option!r}")
        mounts.append((match.group(1), match.group(2)))
        rest = rest.lstrip(" ")
    return _json_argv(rest.strip(), where), tuple(mounts)


def _copy(rest: str, where: str) -> Step:
    words = rest.split()
    if len(words) < 2 or any(word.startswith("--") for word in words):
        raise BuildFailure(f"{where}: expected COPY SOURCE... DESTINATION with no options")
    *sources, destination = words
    for source in sources:
        if source.startswith("/") or ".." in Path(source).parts:
            raise BuildFailure(f"{where}: {source!r} is not a path inside the context")
    if not destination.startswith("/"):
        raise BuildFailure(f"{where}: the destination must be absolute")
    return Step("COPY", 0, "", False, sources=tuple(sources), destination=destination)


def copy_kind(sources: tuple[str, ...]) -> str:
    """What buildah writes before " in" in a COPY step's history: several sources, a directory, a file."""
    if len(sources) > 1:
        return "multi"
    return "dir" if sources[0].endswith("/") else "file"


def parse(text: str, build_args: dict[str, str]) -> Plan:
    """The plan of a rendered Dockerfile; `build_args` are the values given to the build (--build-arg)."""
    lines = _logical_lines(text)
    if not lines or not lines[0][1].startswith("FROM "):
        raise BuildFailure("Dockerfile: the first instruction must be FROM")
    base = lines[0][1][5:].strip()
    if not base or " " in base:
        raise BuildFailure(f"Dockerfile:{lines[0][0]}: expected FROM IMAGE")
    steps: list[Step] = []
    declared: dict[str, str] = {}
    for number, text_line in lines[1:]:
        keyword, _, rest = text_line.partition(" ")
        rest = rest.lstrip(" ")
        where = f"Dockerfile:{number}: {keyword}"
        if keyword == "ARG":
            match = _ARG.match(rest.strip())
            if match is None:
                raise BuildFailure(f"{where}: expected ARG NAME[=DEFAULT]")
            name = match.group(1)
            # An argument with no value (none given, no default) is no argument to buildah: not in the
            # history, not in a RUN step's environment.
            if name in build_args or match.group(2) is not None:
                declared[name] = build_args.get(name, match.group(2))
            # buildah's ARG entry names every argument with a value so far, sorted.
            steps.append(Step("ARG", number, f"/bin/sh -c #(nop) ARG {' '.join(sorted(declared))}", True, value=name))
        elif keyword == "RUN":
            argv, mounts = _run(rest, where)
            # buildah names the build arguments in effect before the shell, as "|N NAME=VALUE ...", sorted
            # as those strings.
            args = sorted(f"{k}={v}" for k, v in declared.items())
            prefix = f"|{len(args)} {' '.join(args)} " if args else ""
            steps.append(Step("RUN", number, f"{prefix}/bin/sh -c {rest}", False, argv=argv, mounts=mounts))
        elif keyword == "COPY":
            copy = _copy(rest, where)
            created_by = f"/bin/sh -c #(nop) COPY {copy_kind(copy.sources)} in {copy.destination} "
            steps.append(Step("COPY", number, created_by, False, sources=copy.sources, destination=copy.destination))
        elif keyword in _METADATA:
            created_by = f"/bin/sh -c #(nop) {keyword} {rest}"
            if keyword in ("ENV", "LABEL"):
                steps.append(Step(keyword, number, created_by, True, pairs=_pairs(rest, where)))
            elif keyword in ("ENTRYPOINT", "CMD"):
                steps.append(Step(keyword, number, created_by, True, argv=_json_argv(rest.strip(), where)))
            else:
                value = rest.strip()
                if not value or (keyword != "EXPOSE" and " " in value):
                    raise BuildFailure(f"{where}: expected one value")
                steps.append(Step(keyword, number, created_by, True, value=value))
        else:
            raise BuildFailure(f"Dockerfile:{number}: the write-once builder does not run {keyword!r}")
    return Plan(base, tuple(steps), declared)
