"""Patch series on disk and their check against the real upstream distributions.

Layout: patches/<distribution>/<version>/series names the patches in order (one
file name a line, `#` comments); each patch is a unified diff relative to
site-packages (a/ b/ prefixes, applied with -p1) after a short header.

Patches are applied here by builder.runtime.apply_patch, the module the image
build runs, so the upstream check and the build follow the same rules.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder import paths
from builder.errors import BuildFailure, UserError
from builder.files import sha256_file
from builder.runtime import apply_patch
@dataclass(frozen=True)
class Patch:
    distribution: str  # canonical name, e.g. "flashinfer-python"
    version: str
    name: str  # file name, e.g. "0001-trtllm-comm-sm120.patch"
    path: Path
    sha256: str
    files: tuple[str, ...]  # site-packages paths it changes


def _canonical(distribution: str, version: str) -> tuple[str, str]:
    try:
        return canonicalize_name(distribution), str(Version(version))
    except InvalidVersion:
        raise UserError(f"{distribution}: {version!r} is not a valid version") from None


def series_dir(distribution: str, version: str, root: Path) -> Path:
    """root: the project's patches/ directory."""
    distribution, version = _canonical(distribution, version)
    return root / distribution / version


def read_series(path: Path) -> list[str]:
    """Patch file names from a series file, in order; `#` starts a comment."""
    names = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if "/" in name or name.startswith(".") or not name.endswith(".patch"):
            raise UserError(f"{path}:{number}: {name!r} is not a patch file name (NAME.patch)")
        if name in names:
            raise UserError(f"{path}:{number}: {name} is listed twice")
        names.append(name)
    return names


def _require_inside(path: Path, root: Path) -> None:
    """A patch is copied into the image: it must resolve inside the patches directory, so a symlink
    cannot bring a file from elsewhere on the host."""
    if path.is_symlink() or not path.resolve().is_relative_to(root.resolve()):
        raise UserError(f"{path}: a patch must be a regular file inside {root} (symlinks are refused)")


def series_for(distribution: str, version: str, root: Path) -> list[Patch]:
    """The patches of one distribution version, in series order."""
    distribution, version = _canonical(distribution, version)
    directory = series_dir(distribution, version, root)
    series = directory / "series"
    if not series.is_file():
        raise UserError(f"no patch series for {distribution} {version} ({series} does not exist)")
    _require_inside(series, root)
    names = read_series(series)
    if not names:
        raise UserError(f"{series}: lists no patches")
    unlisted = sorted(p.name for p in directory.glob("*.patch") if p.name not in names)
    if unlisted:
        raise UserError(f"{series}: {', '.join(unlisted)} not listed; list it or remove it")
    patches = []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise UserError(f"{series}: lists {name}, which does not exist")
        _require_inside(path, root)
        data = path.read_bytes()
        try:
            files = tuple(d.path for d in apply_patch.read_patch(str(path)))
        except apply_patch.PatchError as error:
            raise UserError(f"{path}: {'; '.join(error.problems)}") from None
        patches.append(
            Patch(distribution, version, name, path, hashlib.sha256(data).hexdigest(), files)
        )
    return patches


def all_series(root: Path) -> list[tuple[str, str]]:
    """Every (distribution, version) with a series file under the patches/ directory `root`, sorted."""
    return sorted((s.parent.parent.name, s.parent.name) for s in root.glob("*/*/series"))


def patch_header(path: Path) -> str:
    """Everything before the patch's first file diff: what, why, upstream reference."""
    text = path.read_text(encoding="utf-8")
    first = apply_patch.parse_patch(text, path.name)[0].line
    return "".join(text.splitlines(keepends=True)[: first - 1])


# --- upstream distributions -------------------------------------------------


def cache_dir() -> Path:
    """Upstream wheels the patch check unpacks: <cache root>/dists."""
    return paths.cache_root() / "dists"


def _cached_wheel(directory: Path, distribution: str, version: str) -> Path | None:
    wanted = (canonicalize_name(distribution), Version(version))
    matches = []
    for path in directory.glob("*.whl") if directory.is_dir() else ():
        try:
            name, found, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if (name, found) == wanted:
            matches.append(path)
    return min(matches, default=None)


def fetch_wheel(distribution: str, version: str, cache: Path | None = None) -> Path:
    """The exact upstream wheel, downloaded once by `pip download --no-deps` and cached."""
    distribution, version = _canonical(distribution, version)
    cache = cache or cache_dir()
    found = _cached_wheel(cache, distribution, version)
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    # Download beside the cache and move in only a complete wheel (parallel runs, interrupts).
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as staging:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", staging,
            f"{distribution}=={version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        wheel = _cached_wheel(Path(staging), distribution, version)
        if result.returncode != 0 or wheel is None:
            lines = [ln for ln in (result.stderr or result.stdout).splitlines() if "ERROR" in ln]
            reason = lines[-1].strip() if lines else f"pip exit status {result.returncode}"
            raise UserError(f"cannot download {distribution}=={version}: {reason}")
        target = cache / wheel.name
        os.replace(wheel, target)
    return target


def unpack(wheel: Path, destination: Path) -> Path:
    """A wheel's files as pip installs them into site-packages (pure-Python wheels)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(destination)
    return destination


# --- applying a series --------------------------------------------------------


@dataclass(frozen=True)
class PatchResult:
    patch: Patch
    ok: bool
    problems: tuple[str, ...]  # each names file and hunk
    offsets: tuple[str, ...]
    compiled: tuple[str, ...]


def apply_series(patches: list[Patch], site_packages: Path) -> list[PatchResult]:
    """Apply each patch strictly, in order, byte-compiling what it changed.

    A failing patch changes nothing (apply_patch dry-runs first); the rest are
    still tried so one run reports every failure.
    """
    results = []
    for patch in patches:
        try:
            applied = apply_patch.apply(str(site_packages), str(patch.path))
        except apply_patch.PatchError as error:
            results.append(PatchResult(patch, False, error.problems, (), ()))
            continue
        results.append(PatchResult(patch, True, (), applied.offsets, applied.compiled))
    return results


@dataclass(frozen=True)
class SeriesCheck:
    distribution: str
    version: str
    wheel: str  # file name of the upstream wheel checked against
    wheel_sha256: str
    results: tuple[PatchResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def check_series(
    distribution: str, version: str, *, root: Path, cache: Path | None = None
) -> SeriesCheck:
    """Apply a series to a fresh unpack of its exact upstream wheel, in a temporary directory."""
    distribution, version = _canonical(distribution, version)
    patches = series_for(distribution, version, root)
    wheel = fetch_wheel(distribution, version, cache)
    with tempfile.TemporaryDirectory(prefix="builder-patches-") as workdir:
        site_packages = unpack(wheel, Path(workdir) / "site-packages")
        results = apply_series(patches, site_packages)
    return SeriesCheck(distribution, version, wheel.name, sha256_file(wheel), tuple(results))


def format_check(check: SeriesCheck) -> list[str]:
    lines = [f"{check.distribution} {check.version}: {check.wheel} (sha256 {check.wheel_sha256})"]
    for result in check.results:
        patch = result.patch
        if result.ok:
            lines.append(
                f"  applied {patch.name} sha256 {patch.sha256} "
                f"({len(patch.files)} files, {len(result.compiled)} byte-compiled)"
            )
            lines += [f"    note: {offset}" for offset in result.offsets]
        else:
            lines.append(f"  FAILED  {patch.name}")
            lines += [f"    {problem}" for problem in result.problems]
    return lines


# --- refreshing a series for a new upstream version ---------------------------


@dataclass(frozen=True)
class Refreshed:
    name: str
    ok: bool  # regenerated and written
    detail: tuple[str, ...]  # offsets absorbed, or why a person must look


def _unified_diff(before: Path, after: Path, files: tuple[str, ...]) -> str:
    chunks = []
    for rel in files:
        command = [
            "diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}",
            str(before / rel), str(after / rel),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode > 1:
            raise BuildFailure(f"diff failed on {rel}: {result.stderr.strip()}")
        chunks.append(result.stdout)
    return "".join(chunks)


def refresh_series(
    distribution: str,
    old: str,
    new: str,
    *,
    root: Path,
    cache: Path | None = None,
) -> list[Refreshed]:
    """Carry a series from `old` to the `new` upstream version.

    A patch that still applies with no fuzz (offsets are fine) is regenerated
    against `new`, header kept. One that needs fuzz or has failing hunks is not
    written: it needs a person, and the new series still lists it so a check
    fails until someone supplies it.
    """
    patches = series_for(distribution, old, root)
    target = series_dir(distribution, new, root)
    if target.exists():
        raise UserError(f"{target} already exists; remove it to refresh again")
    wheel = fetch_wheel(distribution, new, cache)
    outcomes: list[Refreshed] = []
    texts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="builder-refresh-") as workdir:
        site_packages = unpack(wheel, Path(workdir) / "site-packages")
        before = Path(workdir) / "before"
        for patch in patches:
            shutil.rmtree(before, ignore_errors=True)
            for rel in patch.files:
                if (site_packages / rel).is_file():
                    (before / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(site_packages / rel, before / rel)
            try:
                applied = apply_patch.apply(str(site_packages), str(patch.path))
            except apply_patch.PatchError as error:
                fuzzy = apply_patch.run_patch(str(site_packages), str(patch.path), dry_run=True, fuzz=2)
                detail = fuzzy.fuzz if fuzzy.ok else error.problems
                outcomes.append(Refreshed(patch.name, False, tuple(detail)))
                continue
            body = _unified_diff(before, site_packages, patch.files)
            texts[patch.name] = patch_header(patch.path) + body
            outcomes.append(Refreshed(patch.name, True, applied.offsets))
    target.mkdir(parents=True)
    distribution, new = _canonical(distribution, new)
    series = [f"# {distribution} {new}: refreshed from {old} by `builder patches refresh`."]
    series += [patch.name for patch in patches]
    (target / "series").write_text("\n".join(series) + "\n", encoding="utf-8")
    for name, text in texts.items():
        (target / name).write_text(text, encoding="utf-8")
    return outcomes
