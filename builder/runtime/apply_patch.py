"""Apply one patch strictly inside site-packages, then byte-compile what it changed.

Runs inside the image during the build, one RUN per patch layer:

    python apply_patch.py --site-packages DIR PATCHFILE

Strict means GNU patch with -p1 and no fuzz: a hunk whose context does not match
exactly (offsets allowed) fails the layer, naming the patch, the file and the hunk.
A dry run comes first, so a failing patch changes nothing. Only unified diffs are
read: GNU patch also applies context diffs, normal diffs, ed scripts and git
extended headers wherever it finds them, so a patch holding any of those is refused,
and GNU patch is handed only the file headers and hunks this reader understood
(every other line blanked), so it cannot change a file the patch does not name. The host's
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

# What GNU patch would take for a diff that is not unified (its intuit_diff_type reads these).
_CONTEXT_HUNK = re.compile(r"^\*{15}|^\*\*\* \d+(,\d+)? \*\*\*\*")
_NORMAL_OR_ED = re.compile(r"^\d+(,\d+)?([acd]\d+(,\d+)?|[acdi]|s/.*)$")
_GIT_BINARY = re.compile(r"^(GIT binary patch$|Binary files .* differ$|(literal|delta) \d+$)")
_GIT_EXTENDED = re.compile(
    r"^(old mode|new mode|deleted file mode|new file mode|rename from|rename to|copy from|copy to"
    r"|similarity index|dissimilarity index) "
)
# Lines allowed between file diffs: git's per-file header, and git format-patch's signature.
_GIT_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_GIT_INDEX = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+( [0-7]{6})?$")
_SIGNATURE = "-- "


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


def _not_unified(lines: list[str], index: int) -> str | None:
    """The kind of non-unified diff syntax at `index`, or None."""
    line = lines[index]
    following = lines[index + 1] if index + 1 < len(lines) else ""
    if _CONTEXT_HUNK.match(line) or (line.startswith("*** ") and following.startswith("--- ")):
        return "a context diff"
    if _NORMAL_OR_ED.match(line):
        return "a normal diff or ed script command"
    if _GIT_BINARY.match(line):
        return "a binary patch"
    if _GIT_EXTENDED.match(line):
        return "a git mode, rename or copy header"
    return None


def _refuse(patch_name: str, index: int, what: str, line: str) -> PatchError:
    shown = line if len(line) <= 60 else line[:57] + "..."
    return PatchError(patch_name, [f"line {index + 1} ({shown!r}) is {what}; only unified diffs are applied"])


def _parse(text: str, patch_name: str) -> tuple[list[FileDiff], list[str]]:
    """The files and hunks of a unified diff, and the text GNU patch is given for it.

    Anything before the first "---" is the patch's header (what, why, upstream). After
    it only file headers, hunks, git's "diff --git"/"index" lines and a trailing "-- "
    signature may appear. Every line that is not a file header or hunk is blanked in
    the returned text, so line numbers stay those of the patch file.
    """
    # Split on "\n" only, as GNU patch does: str.splitlines would also break at \f, \r or U+2028.
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    kept = [""] * len(lines)
    diffs: list[FileDiff] = []
    index = 0
    signed = False  # past git format-patch's "-- " signature: only its trailer remains
    while index < len(lines):
        line = lines[index]
        header = _HUNK_HEADER.match(line)
        file_header = line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ ")
        if signed and (header or file_header):
            raise _refuse(patch_name, index, "a diff after the patch's \"-- \" signature", line)
        if file_header:
            old = _strip_component(line[4:], patch_name)
            new = _strip_component(lines[index + 1][4:], patch_name)
            if old != new:
                raise PatchError(patch_name, [f"renames {old} to {new}; not supported"])
            diffs.append(FileDiff(path=new, line=index + 1, hunks=()))
            kept[index:index + 2] = lines[index:index + 2]
            index += 2
            continue
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
            kept[index:index + 1 + length] = lines[index:index + 1 + length]
            index += 1 + length
            continue
        kind = _not_unified(lines, index)
        if kind:
            raise _refuse(patch_name, index, kind, line)
        if diffs and not signed:
            if line == _SIGNATURE:
                signed = True
            elif _GIT_DIFF.match(line):
                if not _git_diff_has_body(lines, index + 1):
                    raise _git_diff_refusal(lines, index, patch_name)
            elif line.strip() and not _GIT_INDEX.match(line):
                raise _refuse(patch_name, index, "not part of a unified diff", line)
        index += 1
    if not diffs:
        raise PatchError(patch_name, ["no unified diff found (expected --- a/PATH and +++ b/PATH)"])
    empty = [d.path for d in diffs if not d.hunks]
    if empty:
        raise PatchError(patch_name, [f"{path}: no hunks" for path in empty])
    return diffs, kept


def _git_diff_refusal(lines: list[str], index: int, patch_name: str) -> PatchError:
    """Name what a "diff --git" without a unified body holds instead (binary, mode, rename), if known."""
    after = index + 1
    kind = _not_unified(lines, after) if after < len(lines) else None
    if kind:
        return _refuse(patch_name, after, kind, lines[after])
    return _refuse(patch_name, index, "a git diff without a unified body", lines[index])


def _git_diff_has_body(lines: list[str], index: int) -> bool:
    """A "diff --git" line is followed (after an optional "index" line) by "---"/"+++" names."""
    if index < len(lines) and _GIT_INDEX.match(lines[index]):
        index += 1
    return index + 1 < len(lines) and lines[index].startswith("--- ") and lines[index + 1].startswith("+++ ")


def parse_patch(text: str, patch_name: str) -> list[FileDiff]:
    """The files and hunks of a unified diff; anything before the first "---" is its header."""
    return _parse(text, patch_name)[0]


def _read_text(patch_path: str) -> str:
    try:
        with open(patch_path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise PatchError(os.path.basename(patch_path), [f"not UTF-8 text (byte {error.start})"]) from None


def read_patch(patch_path: str) -> list[FileDiff]:
    return parse_patch(_read_text(patch_path), os.path.basename(patch_path))


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
            current = by_path.get(name)
            if current is None:
                current = FileDiff(name, 0, ())
                problems.append(f"{name}: GNU patch would change it, but the patch names no such file")
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
    options = [*STRICT_ARGS, f"--fuzz={fuzz}"] + (["--dry-run"] if dry_run else [])
    return run_gnu_patch(site_packages, patch_path, options)


def run_gnu_patch(site_packages: str, patch_path: str, options: list[str]) -> Outcome:
    """GNU patch with `options`, fed only the unified diff this module read from the patch."""
    name = os.path.basename(patch_path)
    diffs, kept = _parse(_read_text(patch_path), name)
    command = ["patch", *options, "-d", os.path.abspath(site_packages)]
    # C locale: the messages interpret() reads are GNU patch's untranslated ones.
    env = {key: value for key, value in os.environ.items() if key != "POSIXLY_CORRECT"}
    env["LC_ALL"] = "C"
    try:
        result = subprocess.run(
            command, input="".join(line + "\n" for line in kept), capture_output=True, text=True, env=env,
            check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise PatchError(name, ["GNU patch is not installed"]) from None
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
