"""Apply one patch strictly inside site-packages, then byte-compile what it changed.

Runs inside the image during the build, one RUN per patch layer:

    python apply_patch.py --site-packages DIR PATCHFILE

Strict means GNU patch with -p1 and no fuzz: a hunk whose context does not match
exactly (offsets allowed) fails the layer, naming the patch, the file and the hunk.
A dry run comes first, so a failing patch changes nothing. The host's
`builder patches check` imports this module, so the upstream check and the image
build apply patches by the same rules. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import py_compile
import re
import subprocess
import sys
from dataclasses import dataclass

# --forward: a patch that looks already applied is an error, not a reversal.
# --batch: never ask. No backup files, and rejected hunks are discarded (-r -),
# so nothing but the patched files themselves is left behind.
STRICT_ARGS = ("-p1", "--forward", "--batch", "--no-backup-if-mismatch", "--reject-file=-")

_FILE_LINE = re.compile(r"^(?:checking|patching) file (.+)$")
_HUNK_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_HUNK_SUCCEEDED = re.compile(
    r"^Hunk #(\d+) succeeded at (\d+)(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?"
)
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_FILE = re.compile(r"^can't find file to patch at input line (\d+)")
_MALFORMED = re.compile(r"malformed patch at line (\d+)")
_REVERSED = "Reversed (or previously applied) patch detected!"


class PatchError(Exception):
    """A patch did not apply (or could not be read); the message names patch, file and hunk."""

    def __init__(self, patch_name: str, problems: list[str]):
        self.patch_name = patch_name
        self.problems = tuple(problems)
        super().__init__(f"{patch_name}: " + "; ".join(problems))


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based within its file, as GNU patch counts
    header: str  # "@@ -58,7 +58,7 @@"
    line: int  # 1-based line of the header in the patch file
    new_side: tuple[str, ...] = ()  # context and added lines, in order: what the patched file holds


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to site-packages (the -p1-stripped "+++" name)
    line: int  # 1-based line of its "---" line in the patch file
    hunks: tuple[Hunk, ...]

    def hunk_at(self, line: int) -> Hunk | None:
        """The hunk whose text holds patch line `line`."""
        found = None
        for hunk in self.hunks:
            if hunk.line <= line:
                found = hunk
        return found


@dataclass(frozen=True)
class Outcome:
    """What one GNU patch run reported."""

    ok: bool
    problems: tuple[str, ...]  # one line each, naming file and hunk
    offsets: tuple[str, ...]  # hunks that matched elsewhere than the header said
    fuzz: tuple[str, ...]  # hunks that matched only with fuzz (never in strict mode)


def _strip_component(name: str, patch_name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    parts = name.split("/")
    if name == "/dev/null":
        raise PatchError(patch_name, ["patches that create or delete files are not supported"])
    rel = parts[1:]
    if not rel or name.startswith("/") or any(p in ("", ".", "..") for p in rel):
        raise PatchError(patch_name, [f"unsafe or unstripped path {name!r} (expected a/PATH, b/PATH)"])
    return "/".join(rel)


def _hunk_length(lines: list[str], start: int, header: re.Match) -> int | None:
    """Lines of hunk body after its header, counted from the header's line counts.

    None when the body ends before those counts are met (a truncated or edited hunk).
    """
    old = int(header.group(2) or 1)
    new = int(header.group(4) or 1)
    index = start
    while (old > 0 or new > 0) and index < len(lines):
        line = lines[index]
        kind = line[:1]
        if kind in (" ", ""):
            old, new = old - 1, new - 1
        elif kind == "-":
            old -= 1
        elif kind == "+":
            new -= 1
        elif kind != "\\":  # a "\ No newline at end of file" marker counts for neither side
            break
        index += 1
    if old > 0 or new > 0:
        return None
    if index < len(lines) and lines[index].startswith("\\"):
        index += 1
    return index - start


def parse_patch(text: str, patch_name: str) -> list[FileDiff]:
    """The files and hunks of a unified diff; anything before the first "---" is its header."""
    lines = text.splitlines()
    diffs: list[FileDiff] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            old = _strip_component(line[4:], patch_name)
            new = _strip_component(lines[index + 1][4:], patch_name)
            if old != new:
                raise PatchError(patch_name, [f"renames {old} to {new}; not supported"])
            diffs.append(FileDiff(path=new, line=index + 1, hunks=()))
            index += 2
            continue
        header = _HUNK_HEADER.match(line)
        if header and diffs:
            current = diffs[-1]
            hunk = Hunk(number=len(current.hunks) + 1, header=header.group(0), line=index + 1)
            length = _hunk_length(lines, index + 1, header)
            if length is None:
                problem = _describe(current, hunk, "malformed: its body is shorter than its header says")
                raise PatchError(patch_name, [problem])
            body = lines[index + 1:index + 1 + length]
            # An empty body line is context whose leading space was stripped; "-" and "\" lines are not kept.
            new_side = tuple(line[1:] for line in body if line[:1] in (" ", "", "+"))
            hunk = Hunk(hunk.number, hunk.header, hunk.line, new_side)
            diffs[-1] = FileDiff(current.path, current.line, current.hunks + (hunk,))
            index += 1 + length
            continue
        index += 1
    if not diffs:
        raise PatchError(patch_name, ["no unified diff found (expected --- a/PATH and +++ b/PATH)"])
    empty = [d.path for d in diffs if not d.hunks]
    if empty:
        raise PatchError(patch_name, [f"{path}: no hunks" for path in empty])
    return diffs


def read_patch(patch_path: str) -> list[FileDiff]:
    name = os.path.basename(patch_path)
    try:
        with open(patch_path, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as error:
        raise PatchError(name, [f"not UTF-8 text (byte {error.start})"]) from None
    return parse_patch(text, name)


def _diff_at(diffs: list[FileDiff], line: int) -> FileDiff | None:
    found = None
    for diff in diffs:
        if diff.line <= line:
            found = diff
    return found


def _describe(diff: FileDiff | None, hunk: Hunk | None, reason: str) -> str:
    where = diff.path if diff else "(before the first file)"
    if hunk:
        where += f": hunk #{hunk.number}" + (f" ({hunk.header})" if hunk.header else "")
    return f"{where} {reason}"


def _unquote(name: str) -> str:
    # GNU patch quotes names with unusual characters in the C locale: 'a b.py'.
    return name[1:-1] if len(name) > 1 and name[0] == name[-1] == "'" else name


def interpret(output: str, returncode: int, diffs: list[FileDiff]) -> Outcome:
    """Turn GNU patch's report (C locale) into problems naming file and hunk."""
    by_path = {d.path: d for d in diffs}
    current: FileDiff | None = None
    problems: list[str] = []
    offsets: list[str] = []
    fuzz: list[str] = []

    def hunk_of(number: int) -> Hunk:
        if current is None or not 0 < number <= len(current.hunks):
            return Hunk(number, "", 0)  # named by number only
        return current.hunks[number - 1]

    for line in output.splitlines():
        if match := _FILE_LINE.match(line):
            name = _unquote(match.group(1))
            current = by_path.get(name) or FileDiff(name, 0, ())
        elif match := _HUNK_FAILED.match(line):
            hunk = hunk_of(int(match.group(1)))
            problems.append(_describe(current, hunk, f"FAILED at line {match.group(2)}"))
        elif match := _HUNK_SUCCEEDED.match(line):
            hunk = hunk_of(int(match.group(1)))
            if match.group(3):
                fuzz.append(_describe(current, hunk, f"matched with fuzz {match.group(3)}"))
            if match.group(4):
                offsets.append(_describe(current, hunk, f"offset {int(match.group(4)):+d} lines"))
        elif match := _NO_FILE.match(line):
            missing = _diff_at(diffs, int(match.group(1)))
            problems.append(_describe(missing, None, "not found in site-packages"))
        elif match := _MALFORMED.search(line):
            at = int(match.group(1))
            diff = _diff_at(diffs, at)
            hunk = diff.hunk_at(at) if diff else None
            problems.append(_describe(diff, hunk, f"malformed at patch line {at}"))
        elif line.startswith(_REVERSED):
            problems.append(_describe(current, None, "already applied (or reversed)"))
        elif line.startswith("patch: **** "):
            problems.append(line[len("patch: **** "):].strip())
    if returncode != 0 and not problems:
        last = output.strip().splitlines()[-1:] or [f"exit status {returncode}"]
        problems.append(f"GNU patch failed: {last[0]}")
    return Outcome(returncode == 0 and not problems, tuple(problems), tuple(offsets), tuple(fuzz))


def run_patch(site_packages: str, patch_path: str, *, dry_run: bool, fuzz: int = 0) -> Outcome:
    """One GNU patch run over site-packages; fuzz is 0 except to classify a failure."""
    diffs = read_patch(patch_path)
    command = ["patch", *STRICT_ARGS, f"--fuzz={fuzz}", "-d", os.path.abspath(site_packages)]
    if dry_run:
        command.append("--dry-run")
    command += ["-i", os.path.abspath(patch_path)]
    # C locale: the messages interpret() reads are GNU patch's untranslated ones.
    env = {key: value for key, value in os.environ.items() if key != "POSIXLY_CORRECT"}
    env["LC_ALL"] = "C"
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError:
        raise PatchError(os.path.basename(patch_path), ["GNU patch is not installed"]) from None
    return interpret(result.stdout + result.stderr, result.returncode, diffs)


def _clamp_mtime(path: str) -> None:
    # Patched files and their .pyc carry SOURCE_DATE_EPOCH, not the build's wall clock.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        os.utime(path, (int(epoch), int(epoch)))


def byte_compile(site_packages: str, files: list[str], patch_name: str) -> list[str]:
    """Drop every cached .pyc of the patched modules, then compile them afresh.

    py_compile writes checked-hash .pyc when SOURCE_DATE_EPOCH is set, so the
    layer is reproducible and the .pyc can never go stale against its source.
    """
    compiled = []
    for rel in files:
        source = os.path.join(site_packages, rel)
        _clamp_mtime(source)
        if not rel.endswith(".py"):
            continue
        directory, filename = os.path.split(source)
        stem = filename[: -len(".py")]
        cache = os.path.join(directory, "__pycache__")
        if os.path.isdir(cache):
            for name in os.listdir(cache):
                if name.startswith(stem + ".") and name.endswith(".pyc"):
                    os.remove(os.path.join(cache, name))
        if os.path.exists(source + "c"):
            os.remove(source + "c")
        try:
            target = py_compile.compile(source, doraise=True)
        except py_compile.PyCompileError as error:
            message = str(error.exc_value).strip().splitlines()[-1]
            raise PatchError(patch_name, [f"{rel}: does not compile after patching: {message}"]) from None
        _clamp_mtime(target)
        compiled.append(rel)
    return compiled


@dataclass(frozen=True)
class Applied:
    files: tuple[str, ...]  # site-packages paths the patch changed
    compiled: tuple[str, ...]  # the .py among them, byte-compiled
    offsets: tuple[str, ...]


def apply(site_packages: str, patch_path: str) -> Applied:
    """Apply strictly (dry run first, so a failure changes nothing), then byte-compile."""
    name = os.path.basename(patch_path)
    files = [d.path for d in read_patch(patch_path)]
    checked = run_patch(site_packages, patch_path, dry_run=True)
    if not checked.ok:
        raise PatchError(name, list(checked.problems))
    done = run_patch(site_packages, patch_path, dry_run=False)
    if not done.ok:
        raise PatchError(name, list(done.problems))
    compiled = byte_compile(site_packages, files, name)
    return Applied(tuple(files), tuple(compiled), done.offsets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="apply_patch", description="Apply one patch strictly in site-packages and byte-compile it."
    )
    parser.add_argument("--site-packages", required=True, help="directory the a/ b/ paths are relative to")
    parser.add_argument("patch", help="unified diff to apply with -p1")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.patch):
        print(f"apply_patch: error: patch file {args.patch} does not exist", file=sys.stderr)
        return 2
    if not os.path.isdir(args.site_packages):
        print(f"apply_patch: error: site-packages {args.site_packages} is not a directory", file=sys.stderr)
        return 2
    try:
        applied = apply(args.site_packages, args.patch)
    except PatchError as error:
        print(f"apply_patch: error: patch {error}", file=sys.stderr)
        return 1
    name = os.path.basename(args.patch)
    print(f"apply_patch: applied {name}: {', '.join(applied.files)}")
    for offset in applied.offsets:
        print(f"apply_patch: {name}: {offset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
