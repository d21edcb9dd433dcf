"""What `builder status` says about each stack row, gathered once into plain values every view reads:
the lock's record (state, image, smoke, bench, push), the matrix (serve modes, tolerance, patch series),
the reference figures a mode is judged against, and the last look-ups of newer upstream releases."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.bump.index import Index
from builder.bump.newer import KnownRelease, known_releases, newest_release
from builder.config import reference_figures
from builder.config.matrix import LOCAL_SUFFIX, Matrix
from builder.config.stack import Stack
from builder.lock import build_report, store
from builder.lock.model import LockEntry, MeasuredFigure, SmokeRecord
from builder.patches import patch_series
from builder.render.render import mode_references
from builder.runtime.serve.bench import verdict as bench_verdict
from builder.runtime.smoke.report import FAIL, PASS, SKIP, Result

NOT_LOCKED = "not locked"  # a matrix row `builder lock` has not resolved
REJECTED = "rejected"  # no recorded image; the last candidate failed its smoke checks
NOT_MEASURED = "not measured"
NOT_RECORDED = reference_figures.NOT_RECORDED
PATCH_CHECK = "patches.{distribution}/{name}"  # the in-image smoke check of one patch (runtime/smoke/patches.py)
_PATCH_STATES = {"pass": "applied", "fail": "failed", "skip": "skipped"}


@dataclass(frozen=True)
class Smoke:
    """A smoke run's outcome; counts are None when the lock keeps no per-check results."""

    outcome: str  # "passed", "failed" or "not run"
    image_id: str | None = None
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None
    failed_checks: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.outcome == "not run":
            return "not run"
        counts = "" if self.passed is None else f" ({self.passed} passed, {self.failed} failed, {self.skipped} skipped)"
        failing = f": {', '.join(self.failed_checks)}" if self.failed_checks else ""
        return f"{self.outcome}{counts}{failing}"


@dataclass(frozen=True)
class ModeBench:
    """One serve mode's bench figure against the reference it is judged by."""

    mode: str
    tolerance: float
    reference_tok_s: float | None  # None: no figure is pinned for the mode nor for the row it replaces
    reference: str  # whose figure: "sglang-0.5.9-cu128 baseline", or why there is none
    tok_s: float | None = None  # None: not measured on the recorded image
    verdict: str = NOT_MEASURED  # pass, regression, faster, unpinned (bench's words), or not measured
    change: float | None = None  # tok_s / reference - 1
    hardware: str | None = None
    model: str | None = None

    def describe(self) -> str:
        reference = f"{self.reference_tok_s:g}" if self.reference_tok_s is not None else "none"
        limit = f"±{self.tolerance * 100:g}%"
        if self.tok_s is None:
            return f"{self.mode} -/{reference} ({limit}) {self.verdict}"
        change = f" {self.change * 100:+.1f}%" if self.change is not None else ""
        return f"{self.mode} {self.tok_s:.1f}/{reference}{change} ({limit}) {self.verdict}"


@dataclass(frozen=True)
class PatchState:
    distribution: str
    version: str
    name: str
    in_image: str  # applied, failed or skipped (its smoke check), not checked, or not built
    upstream: str | None = None  # the last bump's verdict against a newer release: "needs porting for 0.5.23"

    def describe(self) -> str:
        upstream = f", {self.upstream}" if self.upstream else ""
        return f"{self.distribution} {self.version} {self.name}: {self.in_image}{upstream}"


@dataclass(frozen=True)
class Newer:
    package: str
    pinned: str
    newest: str
    checked: str


@dataclass(frozen=True)
class Row:
    stack: str
    family: str
    state: str  # resolved, built, smoke-passed, pinned (the lock's words), rejected, or not locked
    cuda: str
    base: str  # the base's name, with the digest that pins it when the lock has one
    image_id: str | None
    immutable_tag: str | None
    manifest_digest: str | None  # once pushed
    engine: str | None  # "buildah 1.28.2"; None: no image, or recorded before engines were
    smoke: Smoke
    rejected: Smoke | None  # a candidate that failed its smoke checks and was never recorded
    modes: tuple[ModeBench, ...]
    patches: tuple[PatchState, ...]
    newer: tuple[Newer, ...]  # releases newer than the row's pins that the last look-ups found
    newer_checked: str | None  # when the oldest look-up of the row's packages was made; None: never here

    @property
    def short_image(self) -> str | None:
        return short(self.image_id)


@dataclass(frozen=True)
class Upstream:
    """A package the rows pin, the newest release the last look-up found, and each row's pin."""

    package: str
    newest: str | None
    checked: str | None
    pins: tuple[tuple[str, str], ...]  # (row, version)

    def newer_than(self, version: str) -> bool:
        return self.newest is not None and _newer(self.newest, version)


@dataclass(frozen=True)
class Status:
    rows: tuple[Row, ...]
    upstream: tuple[Upstream, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def short(digest: str | None, length: int = 12) -> str | None:
    """sha256:434ed7f4279f... -> 434ed7f4279f."""
    return digest.split(":", 1)[-1][:length] if digest else None


def _newer(newest: str, pinned: str) -> bool:
    try:
        return Version(newest) > Version(Version(pinned).public)
    except InvalidVersion:
        return False


def looked_up_packages(matrix: Matrix) -> list[str]:
    """What `--refresh-newer` asks pip's default index about: every package a registry row takes from it."""
    return list(dict.fromkeys(p.name for row in matrix.registry_stacks for p in row.packages
                              if not (p.index or p.url)))


def collect(matrix: Matrix, names: list[str] | None = None, refresh_newer: bool = False) -> Status:
    """The status of the rows named (every row when none). Only `refresh_newer` uses the network: it asks
    pip's default index for the newest releases, as `builder bump --newer` does, and remembers them."""
    rows = tuple(matrix.stack(name) for name in dict.fromkeys(names)) if names else matrix.all_rows()
    if refresh_newer:
        index = Index()
        for package in looked_up_packages(matrix):
            newest_release(package, index)
    return gather(matrix, rows, matrix.project.lock, known_releases())


def gather(matrix: Matrix, rows: tuple[Stack, ...], lock_path: Path,
           known: dict[str, KnownRelease]) -> Status:
    lock = store.read(lock_path)
    bump_verdicts = _bump_verdicts(matrix.project.reports)
    gathered = tuple(_row(stack, lock.get(stack.name), matrix, bump_verdicts, known) for stack in rows)
    upstream = []
    for package in looked_up_packages(matrix):
        pins = tuple((s.name, s.package(package).version) for s in rows if s.package(package))
        release = known.get(package)
        if pins:
            upstream.append(Upstream(package, release.newest if release else None,
                                     release.checked if release else None, pins))
    return Status(gathered, tuple(upstream))


def _row(stack: Stack, entry: LockEntry | None, matrix: Matrix,
         bump_verdicts: dict, known: dict[str, KnownRelease]) -> Row:
    outcome = entry.outcome if entry else None
    image = outcome.image if outcome else None
    state = NOT_LOCKED if entry is None else outcome.status
    if outcome and image is None and outcome.rejected_candidate and not outcome.rejected_candidate.passed:
        state = REJECTED
    smoke_results = outcome.smoke.report.results if outcome and outcome.smoke and outcome.smoke.report else None
    smoke = _smoke(outcome.smoke) if outcome and outcome.smoke else Smoke("not run")
    rejected = None
    if outcome and outcome.rejected_candidate:
        candidate = outcome.rejected_candidate
        rejected = _smoke(candidate)
    base = image.base if image else entry.resolution.base if entry else None  # what the image was built on
    base_text = stack.base.name + (f"@{short(base.pin)}" if base and base.pin else "")
    newer = tuple(Newer(p.name, p.version, known[p.name].newest, known[p.name].checked)
                  for p in stack.packages if p.name in known and _newer(known[p.name].newest, p.version))
    return Row(
        stack=stack.name, family=stack.family, state=state, cuda=stack.cuda, base=base_text,
        image_id=image.image_id if image else None, immutable_tag=image.immutable_tag if image else None,
        manifest_digest=image.manifest_digest if image else None,
        engine=str(image.engine) if image and image.engine else None,
        smoke=smoke, rejected=rejected,
        modes=_modes(stack, outcome.bench.measured if outcome and image else (), matrix),
        patches=_patches(stack, matrix, smoke_results if image else None, image is not None, bump_verdicts),
        newer=newer, newer_checked=min((known[p.name].checked for p in stack.packages if p.name in known),
                                       default=None),
    )


def _smoke(record: SmokeRecord) -> Smoke:
    outcome = "passed" if record.passed else "failed"
    if record.report is None:
        return Smoke(outcome, record.image_id)
    counts = record.report.counts()
    return Smoke(outcome, record.image_id, counts[PASS], counts[FAIL], counts[SKIP],
                 tuple(record.report.failures()))


def _modes(stack: Stack, measured: tuple[MeasuredFigure, ...], matrix: Matrix) -> tuple[ModeBench, ...]:
    references = mode_references(stack, matrix.project.reference_figures)
    tolerance = stack.bench.regression_tolerance
    found = []
    for mode in stack.serve.modes:
        own, replaced = references[mode.name]["own"], references[mode.name]["replaced"]
        figure = own or replaced
        if figure:
            whose = f"{figure['stack']} {figure['mode']}" + ("" if own else " (the row it replaces)")
            reference = ModeBench(mode.name, tolerance, figure["tok_s"], whose)
        else:
            reference = ModeBench(mode.name, tolerance, None, "none pinned, nor for the row it replaces")
        figures = [f for f in measured if f.mode == mode.name]
        if not figures:
            found.append(reference)
        for item in figures:
            judged_by = item.reference_tok_s if item.reference_tok_s is not None else reference.reference_tok_s
            ratio, computed = bench_verdict(item.tok_s, judged_by, tolerance)
            found.append(ModeBench(
                mode.name, tolerance, judged_by, reference.reference, item.tok_s, item.verdict or computed,
                None if ratio is None else ratio - 1.0, item.hardware, item.model))
    return tuple(found)


def _patches(stack: Stack, matrix: Matrix, results: tuple[Result, ...] | None, built: bool,
             bump_verdicts: dict) -> tuple[PatchState, ...]:
    statuses = {result.check: result.status for result in results or ()}
    found = []
    for distribution, version in stack.patch_series:
        series = patch_series.series_dir(distribution, version, matrix.project.patches) / "series"
        for name in patch_series.read_series(series):
            check = statuses.get(PATCH_CHECK.format(distribution=distribution, name=name))
            in_image = _PATCH_STATES.get(check, "not checked") if built else "not built"
            upstream = bump_verdicts.get((distribution, version, name))
            found.append(PatchState(distribution, version, name, in_image,
                                    f"{upstream['verdict']} for {upstream['new_version']}" if upstream else None))
    return tuple(found)


def _bump_verdicts(reports: Path) -> dict[tuple[str, str, str], dict]:
    """(distribution, version, patch) -> the verdict of the bump that judged it against the newest release."""
    found: dict[tuple[str, str, str], dict] = {}
    for path in sorted(reports.glob("bump-*.json")):
        try:
            verdicts = json.loads(path.read_text(encoding="utf-8"))["verdicts"]
            for item in verdicts:
                key = (item["distribution"], item["old_version"], item["name"])
                if key not in found or Version(item["new_version"]) > Version(found[key]["new_version"]):
                    found[key] = item
        except (OSError, ValueError, KeyError, TypeError, InvalidVersion):
            continue  # a bump record from an older builder, or a torn one: it names no verdicts here
    return found


# --- the page's extras -------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    step: str  # what made it, as the image's history says
    bytes: int


def image_layers(entry: LockEntry | None, root: Path) -> tuple[tuple[Layer, ...], str | None]:
    """The recorded image's layers and their sizes, from its build report (builder/build_stack/build.py), and
    the report's path; no layers when no image is recorded or its report is not there."""
    image = entry.outcome.image if entry else None
    if image is None:
        return (), None
    try:
        layers = build_report.read(root / image.report).layers
    except (OSError, ValueError):
        return (), image.report
    return tuple(Layer(layer.step, layer.size or 0) for layer in layers), image.report


@dataclass(frozen=True)
class ReferenceLine:
    """A reference figure drawn on a row's plot, labelled with its row and the deployment's note."""

    stack: str
    mode: str
    tok_s: float
    attention_backend: str
    note: str  # NOT_RECORDED where the notes say nothing
    pinned: bool


def reference_lines(stack: Stack, figures: dict[str, list[dict]]) -> tuple[ReferenceLine, ...]:
    """Every reference figure of the row and of the row it replaces (a -local row shares its registry
    row's figures), the ones bench may judge it by."""
    rows = [stack.name.removesuffix(LOCAL_SUFFIX)]
    if stack.replaces:
        rows.append(stack.replaces.removesuffix(LOCAL_SUFFIX))
    return tuple(ReferenceLine(f["stack"], f["mode"], f["tok_s"], f["attention_backend"],
                               f.get("note") or NOT_RECORDED, f["pinned"])
                 for row in rows for f in figures.get(row, []))
