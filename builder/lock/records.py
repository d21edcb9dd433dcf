"""What builds, smoke runs, pushes and benches write back into a lock entry's outcome."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from builder.errors import BuildFailure, UserError
from builder.lock import store
from builder.lock.smoke_report import SmokeReport
from builder.paths import project_relative
from builder.lock.model import (
    STATUS_BUILT, STATUS_PINNED, STATUS_SMOKE_PASSED, Bench, ImageRecord, LockEntry, MeasuredFigure,
    PinnedRecord, PushRecord, SmokeRecord,
)


def record_build(name: str, image: ImageRecord, smoke: SmokeReport, path: Path) -> None:
    """A built image that passed its smoke checks, recorded in one write. Rebuilding the image the lock
    already records keeps what was learnt about it (push, measurements, pin); a new image starts over."""

    def change(lock: store.LockFile) -> None:
        found = lock.require(name)
        previous = found.outcome.image
        same_image = previous is not None and previous.image_id == image.image_id
        record = image
        if same_image:
            record = replace(image, manifest_digest=previous.manifest_digest, sbom=image.sbom or previous.sbom)
        outcome = replace(found.outcome, image=record, smoke=SmokeRecord(image.image_id, True, smoke),
                          rejected_candidate=None)
        if not same_image:
            outcome = replace(outcome, status=STATUS_SMOKE_PASSED, push=None, pinned=None,
                              bench=replace(outcome.bench, measured=()))
        elif outcome.status not in (STATUS_SMOKE_PASSED, STATUS_PINNED):
            outcome = replace(outcome, status=STATUS_SMOKE_PASSED)
        lock.put(replace(found, outcome=outcome))

    store.update(change, path)


def record_smoke(name: str, report: SmokeReport, image_id: str | None = None, *, path: Path) -> None:
    """The smoke result of the recorded image (or of `image_id`: a candidate that was never recorded
    is kept apart and changes nothing else)."""
    passed, kept = report.passed, report

    def change(lock: store.LockFile) -> None:
        found = lock.require(name)
        image = found.outcome.image
        if image is None or (image_id is not None and image_id != image.image_id):
            lock.put(found.with_outcome(rejected_candidate=SmokeRecord(image_id, bool(passed), kept)))
            return
        lock.put(found.with_outcome(
            smoke=SmokeRecord(image.image_id, bool(passed), kept),
            status=STATUS_SMOKE_PASSED if passed else STATUS_BUILT,
            pinned=found.outcome.pinned if passed else None,
        ))

    store.update(change, path)


def record_push(name: str, push: PushRecord, *, path: Path) -> None:
    def change(lock: store.LockFile) -> None:
        found = lock.require(name)
        image = found.outcome.image
        lock.put(found.with_outcome(
            push=push, image=replace(image, manifest_digest=push.manifest_digest) if image else None))

    store.update(change, path)


def measured_figure(report: dict, image_id: str, report_path: str | Path | None = None,
                    lock_path: Path | None = None) -> MeasuredFigure:
    """A measured figure from a bench report (builder/runtime/serve/bench.py, schema 1)."""
    try:
        gpus = list(report["gpus"])
        figure = MeasuredFigure(
            mode=report["mode"], tok_s=float(report["tok_s"]), ttft_ms=report.get("ttft_ms"),
            model=report.get("model") or "unrecorded", hardware=_hardware(gpus), image_id=image_id,
            verdict=report.get("verdict"), reference_tok_s=report.get("reference_tok_s"),
            workload=report.get("workload"),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{report_path or 'bench report'}: not a bench report ({error})") from None
    if report_path is None:
        return figure
    kept = project_relative(report_path, Path(lock_path).parent) if lock_path else Path(report_path).as_posix()
    return replace(figure, report=kept)


def _hardware(gpus: list[str]) -> str:
    if not gpus:
        return "unrecorded"
    names = sorted(set(gpus))
    return ", ".join(f"{gpus.count(name)}x {name}" for name in names)


def record_bench(name: str, report: dict, report_path: str | Path | None = None, *, path: Path) -> MeasuredFigure:
    """A measured bench figure for the recorded image; replaces an earlier one of the same mode,
    hardware and model."""
    if report.get("stack") not in (None, name):
        raise UserError(f"{report_path or 'bench report'}: measured {report['stack']}, not {name}")
    recorded: list[MeasuredFigure] = []

    def change(lock: store.LockFile) -> None:
        found = lock.require(name)
        image = found.outcome.image
        if image is None:
            raise UserError(f"{name}: no image recorded; build or pull it first")
        figure = measured_figure(report, image.image_id, report_path, path)
        measured = [f for f in found.outcome.bench.measured if f.key != figure.key]
        bench = Bench(found.outcome.bench.reference, tuple(sorted([*measured, figure], key=lambda f: f.key)))
        lock.put(found.with_outcome(bench=bench))
        recorded.append(figure)

    store.update(change, path)
    return recorded[0]


def pin(name: str, references: list[dict], path: Path) -> LockEntry:
    """Promote the stack's image to `pinned`: only one whose smoke checks passed, and none with a
    measured bench regression. The reference figures become its recorded baselines."""
    pinned: list[LockEntry] = []

    def change(lock: store.LockFile) -> None:
        found = lock.require(name)
        outcome = found.outcome
        if outcome.image is None:
            raise UserError(f"{name} cannot be pinned: no image was built (status {outcome.status})")
        if not outcome.smoke_passed:
            raise UserError(f"{name} cannot be pinned: its image {outcome.image.image_id} has not passed smoke "
                            f"(status {outcome.status})")
        regressions = [f.mode for f in outcome.bench.measured if f.verdict == "regression"]
        if regressions:
            raise BuildFailure(f"{name} cannot be pinned: bench regression in {', '.join(sorted(regressions))}")
        done = found.with_outcome(
            bench=replace(outcome.bench, reference=tuple(references)), status=STATUS_PINNED,
            pinned=PinnedRecord(outcome.image.image_id, outcome.image.manifest_digest))
        lock.put(done)
        pinned.append(done)

    store.update(change, path)
    return pinned[0]


def pin_stack(name: str, references: list[dict], bench_reports: list[str | Path] = (), *,
              path: Path) -> LockEntry:
    """Record each bench report measured on the image, then pin (a regression refuses the pin,
    but its measurement stays recorded)."""
    for report_path in bench_reports:
        try:
            report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        except OSError as error:
            raise UserError(f"{report_path}: cannot read the bench report: {error.strerror}") from None
        except json.JSONDecodeError as error:
            raise UserError(f"{report_path}:{error.lineno}: not valid JSON ({error.msg})") from None
        record_bench(name, report, report_path, path=path)
    return pin(name, references, path)
