"""A verdict for each patch of an old series against a new upstream wheel, for `builder bump`.

- carried: applies strictly (offsets allowed, no fuzz); regenerated against the new files with the
  same header and re-applied to a fresh unpack of the new wheel;
- dropped: upstream already has the change: the patch applies in reverse, or every line it adds is
  already in the file; the evidence quotes those lines where upstream has them;
- needs porting: neither; names the file and each hunk whose old text is not there, with what
  upstream has at the nearest place now. Nothing is written as if it applied.

Patches are checked in series order on one unpacked tree, carried ones applied as they go, so a later
patch sees what an earlier one changed (as in the image).
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from builder.errors import UserError
from builder.files import sha256_file
from builder.patches import patch_series
from builder.runtime import apply_patch

CARRIED, DROPPED, NEEDS_PORTING = "carried", "dropped", "needs porting"
_SHOWN_LINES = 4  # lines of upstream's text shown either side of where a hunk belonged


@dataclass(frozen=True)
class Hunk:
    path: str
    header: str
    old: tuple[str, ...]  # context and removed lines: what the hunk expects
    added: tuple[str, ...]  # the lines it adds
    removed: tuple[str, ...] = ()  # the lines it changes or deletes

    def distinctive(self) -> list[str]:
        """Lines worth searching for, the ones it changes first, longest first."""
        pick = lambda lines: sorted((ln.strip() for ln in lines if len(ln.strip()) > 12), key=len, reverse=True)
        return list(dict.fromkeys(pick(self.removed) + pick(self.old)))


@dataclass(frozen=True)
class Verdict:
    name: str
    distribution: str
    old_version: str
    new_version: str
    wheel: str  # the new upstream wheel checked against
    wheel_sha256: str
    kind: str
    evidence: tuple[str, ...]  # quoted lines: why this verdict
    refreshed: str = field(default="", repr=False)  # carried: the regenerated patch text

    def to_dict(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "old_version": self.old_version,
                "new_version": self.new_version, "wheel": self.wheel, "wheel_sha256": self.wheel_sha256,
                "verdict": self.kind, "evidence": list(self.evidence)}


def hunks(text: str) -> list[Hunk]:
    """The hunks of a unified diff (its header before the first `--- ` is ignored)."""
    found: list[Hunk] = []
    path, header, old, added, removed, started = "", "", [], [], [], False

    def close() -> None:
        if header:
            found.append(Hunk(path, header, tuple(old), tuple(added), tuple(removed)))

    for line in text.splitlines():
        if line.startswith("--- ") and not (header and old and line[4:].startswith(" ")):
            started = True
            continue
        if not started:
            continue
        if line.startswith("+++ "):
            close()
            header, old, added, removed = "", [], [], []
            path = line[4:].split("\t")[0].strip().split("/", 1)[1]
        elif line.startswith("@@"):
            close()
            header, old, added, removed = line.split("@@")[1].strip().join(("@@ ", " @@")), [], [], []
        elif line.startswith("+"):
            added.append(line[1:])
        elif line.startswith("-"):
            old.append(line[1:])
            removed.append(line[1:])
        elif line.startswith(" ") or line == "":
            old.append(line[1:])
    close()
    return found


def _reverse_applies(site_packages: Path, patch: Path) -> apply_patch.Outcome:
    options = ["-p1", "-R", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-", "--dry-run"]
    return apply_patch.run_gnu_patch(str(site_packages), str(patch), options)


def _find_block(lines: list[str], block: tuple[str, ...]) -> int | None:
    """0-based index where `block` occurs in `lines` (compared without trailing blanks), else None."""
    wanted = [line.rstrip() for line in block]
    if not wanted:
        return None
    stripped = [line.rstrip() for line in lines]
    for start in range(len(stripped) - len(wanted) + 1):
        if stripped[start:start + len(wanted)] == wanted:
            return start
    return None


def _file_lines(site_packages: Path, relative: str) -> list[str] | None:
    path = site_packages / relative
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else None


def _added_present(site_packages: Path, patch_hunks: list[Hunk]) -> list[str] | None:
    """Evidence that every hunk's added lines are already in its file (in order, as a block), else None."""
    evidence = []
    for hunk in patch_hunks:
        lines = _file_lines(site_packages, hunk.path)
        added = tuple(line for line in hunk.added if line.strip())
        at = _find_block(lines, added) if lines is not None and added else None
        if at is None:
            return None
        evidence.append(f"{hunk.path} {hunk.header}: upstream has the added lines at line {at + 1}:")
        evidence += [f"    {at + 1 + i}: {line}" for i, line in enumerate(lines[at:at + len(added)])]
    return evidence


def _reverse_evidence(site_packages: Path, patch_hunks: list[Hunk]) -> list[str]:
    evidence = []
    for hunk in patch_hunks:
        lines = _file_lines(site_packages, hunk.path) or []
        block = tuple(line for line in hunk.added if line.strip())
        at = _find_block(lines, block) if block else None
        where = f"line {at + 1}" if at is not None else "its place"
        evidence.append(f"{hunk.path} {hunk.header}: the patch applies in reverse; upstream has at {where}:")
        if at is not None:
            evidence += [f"    {at + 1 + i}: {line}" for i, line in enumerate(lines[at:at + len(block)])]
    return evidence


def _nearest(lines: list[str], hunk: Hunk) -> int | None:
    """Where a hunk that no longer fits belonged: the first of its distinctive old lines found."""
    stripped = [line.strip() for line in lines]
    for candidate in hunk.distinctive():
        if candidate in stripped:
            return stripped.index(candidate)
    return None


def _moved_to(wheel: Path, hunk: Hunk) -> list[str]:
    """Where the hunk's text went when its file left the wheel: the wheel's Python files holding the
    first of its distinctive lines that any file holds, each with the lines around it (read from the
    archive: unpacking thousands of files costs more than reading them)."""
    with zipfile.ZipFile(wheel) as archive:
        sources = {name: archive.read(name).decode("utf-8", errors="replace").splitlines()
                   for name in sorted(archive.namelist()) if name.endswith(".py")}
    for candidate in hunk.distinctive():
        shown = []
        for name, lines in sources.items():
            stripped = [line.strip() for line in lines]
            if candidate not in stripped:
                continue
            at = stripped.index(candidate)
            start, end = max(0, at - _SHOWN_LINES), min(len(lines), at + _SHOWN_LINES + 1)
            shown.append(f"    {name} lines {start + 1}-{end}:")
            shown += [f"      {number}: {line}" for number, line in enumerate(lines[start:end], start=start + 1)]
        if shown:
            return [f"  `{candidate}` is now in:", *shown[:4 * (2 * _SHOWN_LINES + 2)]]
    return []


def _porting_evidence(site_packages: Path, wheel: Path, patch_hunks: list[Hunk],
                      problems: tuple[str, ...]) -> list[str]:
    evidence = [f"GNU patch (strict): {problem}" for problem in problems]
    for hunk in patch_hunks:
        lines = _file_lines(site_packages, hunk.path)
        if lines is None:
            evidence.append(f"{hunk.path} {hunk.header}: the file is not in the new wheel")
            evidence += _moved_to(wheel, hunk)
            continue
        if _find_block(lines, hunk.old) is not None:
            continue  # this hunk still fits
        at = _nearest(lines, hunk)
        if at is None:
            evidence.append(f"{hunk.path} {hunk.header}: none of the hunk's old lines is in the new file")
            evidence += _moved_to(wheel, hunk)
            continue
        start, end = max(0, at - _SHOWN_LINES), min(len(lines), at + _SHOWN_LINES + 1)
        evidence.append(f"{hunk.path} {hunk.header}: the hunk expects other text; upstream has now (lines {start + 1}-{end}):")
        evidence += [f"    {number}: {line}" for number, line in enumerate(lines[start:end], start=start + 1)]
    return evidence


def _unpack_patched(wheel: Path, destination: Path, patched: set[str]) -> Path:
    """Only the files the patches touch: all GNU patch reads (unpacking a whole wheel's thousands of
    files costs tens of seconds on a busy disk)."""
    destination.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name in patched]
        archive.extractall(destination, members)
    return destination


def _refreshed_text(patch: patch_series.Patch, before: Path, after: Path) -> str:
    return patch_series.patch_header(patch.path) + patch_series._unified_diff(before, after, patch.files)


def _recheck(patches: list[tuple[patch_series.Patch, str]], wheel: Path) -> list[str]:
    """Apply the refreshed texts, in order, to a fresh unpack of the new wheel: problems, if any."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="builder-verdict-recheck-") as workdir:
        site_packages = _unpack_patched(wheel, Path(workdir) / "site-packages",
                                        {f for patch, _ in patches for f in patch.files})
        for patch, text in patches:
            path = Path(workdir) / patch.name
            path.write_text(text, encoding="utf-8")
            try:
                apply_patch.apply(str(site_packages), str(path))
            except apply_patch.PatchError as error:
                problems += [f"{patch.name}: {problem}" for problem in error.problems]
    return problems


def judge_series(distribution: str, old_version: str, new_version: str, *, root: Path,
                 cache: Path | None = None) -> list[Verdict]:
    """A verdict for every patch of distribution's old series on the new version's real wheel."""
    patches = patch_series.series_for(distribution, old_version, root)
    wheel = patch_series.fetch_wheel(distribution, new_version, cache)
    wheel_sha256 = sha256_file(wheel)
    verdicts: list[Verdict] = []
    carried: list[tuple[patch_series.Patch, str]] = []
    with tempfile.TemporaryDirectory(prefix="builder-verdict-") as workdir:
        site_packages = _unpack_patched(wheel, Path(workdir) / "site-packages", {f for p in patches for f in p.files})
        before = Path(workdir) / "before"
        for patch in patches:
            patch_hunks = hunks(patch.path.read_text(encoding="utf-8"))
            forward = apply_patch.run_patch(str(site_packages), str(patch.path), dry_run=True)

            def verdict(kind: str, evidence: list[str], refreshed: str = "") -> Verdict:
                return Verdict(patch.name, patch.distribution, old_version, new_version, wheel.name,
                               wheel_sha256, kind, tuple(evidence), refreshed)

            if forward.ok:
                shutil.rmtree(before, ignore_errors=True)
                for relative in patch.files:
                    if (site_packages / relative).is_file():
                        (before / relative).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(site_packages / relative, before / relative)
                applied = apply_patch.apply(str(site_packages), str(patch.path))
                text = _refreshed_text(patch, before, site_packages)
                carried.append((patch, text))
                notes = [f"applies strictly{' with offsets' if applied.offsets else ''}; refreshed to "
                         f"{new_version}'s lines", *[f"offset: {offset}" for offset in applied.offsets]]
                verdicts.append(verdict(CARRIED, notes, text))
                continue
            if _reverse_applies(site_packages, patch.path).ok:
                verdicts.append(verdict(DROPPED, _reverse_evidence(site_packages, patch_hunks)))
                continue
            present = _added_present(site_packages, patch_hunks)
            if present is not None:
                verdicts.append(verdict(DROPPED, ["every line the patch adds is already upstream:", *present]))
                continue
            verdicts.append(verdict(NEEDS_PORTING, _porting_evidence(site_packages, wheel, patch_hunks, forward.problems)))
    problems = _recheck(carried, wheel) if carried else []
    if problems:
        raise UserError(f"{distribution} {new_version}: a refreshed patch failed its re-check: {'; '.join(problems)}")
    recheck = "re-checked: the refreshed series applies strictly to a fresh unpack of the new wheel"
    return [replace(v, evidence=v.evidence + (recheck,)) if v.kind == CARRIED else v for v in verdicts]


def write_series(distribution: str, old_version: str, new_version: str, verdicts: list[Verdict],
                 root: Path, report: str) -> Path | None:
    """patches/<distribution>/<new>/: the carried patches listed and written; a patch that needs porting
    kept beside them as NAME.needs-porting and named in a comment, never listed (so never applied);
    a dropped one named in a comment. None (nothing written) when no patch is carried."""
    if not any(v.kind == CARRIED for v in verdicts):
        return None
    target = patch_series.series_dir(distribution, new_version, root)
    if target.exists():
        raise UserError(f"{target} already exists; remove it to bump again")
    lines = [f"# {distribution} {new_version}: carried from {old_version} by `builder bump`; verdicts and",
             f"# evidence in {report}. Each patch applies with -p1 inside site-packages, in this order."]
    for verdict in verdicts:
        if verdict.kind == DROPPED:
            lines.append(f"# dropped: {verdict.name} (upstream {new_version} already has it)")
        elif verdict.kind == NEEDS_PORTING:
            lines.append(f"# NEEDS PORTING, not applied: {verdict.name} (the old patch is kept as "
                         f"{verdict.name}.needs-porting)")
    target.mkdir(parents=True)
    for verdict in verdicts:
        if verdict.kind == CARRIED:
            lines.append(verdict.name)
            (target / verdict.name).write_text(verdict.refreshed, encoding="utf-8")
        elif verdict.kind == NEEDS_PORTING:
            source = patch_series.series_dir(distribution, old_version, root) / verdict.name
            shutil.copyfile(source, target / f"{verdict.name}.needs-porting")
    (target / "series").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target
