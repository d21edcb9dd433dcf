"""Smoke results kept with what each check read: a check runs again only when something it read changed.

A check here is one of the smoke program's groups (`CHECKS` in builder/runtime/smoke/program.py: versions,
imports, abi, ...), the unit its `--only` runs. Run in its own container under the read tracer
(smoke/read_tracer), a check leaves its results and its reads; each read is kept with its identity in the
image it ran on (smoke/image_files.py). In a later image the results stand when every read has the same
identity there, the image's runtime settings are the same, and every result passed (a failure is always
looked at again). What the tracer cannot follow (another program, a crash) makes the check read the
whole image: it then stands only for the same layers.

The runs that answered a built image's checks are also written beside its build report
(`build-reports/<stack>.smoke-reads.json.gz`, committed with the lock), so a fresh clone's first change
is answered as the host that built the lock would answer it; the host's own records come first.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builder import files as file_writes
from builder.runtime.smoke import report as smoke_report
from builder.smoke.image_files import ABSENT, ImageFiles

KEPT_PER_CHECK = 4  # records per check: a change and its revert both stay answered
_FORMAT = 1
COMMITTED_SUFFIX = ".smoke-reads.json.gz"
# Kernel file systems, and scratch directories where a check's own run makes files (temporary names are
# random): what is there is the run's, not the image's, unless the image itself holds the path.
_KERNEL_ROOTS = ("/proc/", "/sys/", "/dev/")
_SCRATCH_ROOTS = ("/tmp/", "/var/tmp/", "/run/")


@dataclass(frozen=True)
class Reads:
    """What one check's processes read: (kind, path) pairs, and whether every process said `end`."""

    entries: frozenset[tuple[str, str]]
    complete: bool


def parse_traces(texts: Iterable[str]) -> Reads:
    """The tracer's files of one check's processes, merged."""
    entries: set[tuple[str, str]] = set()
    complete = True
    for text in texts:
        lines = text.splitlines()
        if not lines or lines[0] != "begin" or lines[-1] != "end":
            complete = False
        for line in lines[1:-1] if complete else lines:
            kind, _, path = line.partition("\t")
            if path:
                entries.add((kind, path))
    return Reads(frozenset(entries), complete)


def settings_identity(config: Mapping[str, object]) -> str:
    """What the image's config gives every process of the check (environment, user, working directory)."""
    runtime = config.get("config") or {}
    return hashlib.sha256(json.dumps(runtime, sort_keys=True).encode()).hexdigest()


def identities(reads: Reads, files: ImageFiles, settings: str) -> dict[str, str]:
    """{read: its identity in `files`}; a read the tracer could not follow stands for the whole image."""
    known = {"settings": settings}
    if not reads.complete or any(kind == "any" for kind, _ in reads.entries):
        known["image"] = ",".join(files.diff_ids)
    fields = _FieldReader(files)
    for kind, path in sorted(reads.entries):
        if kind in ("read", "stat", "list") and _is_the_runs_own(path, files):
            continue
        if kind == "read":
            known[f"read\t{path}"] = files.identity(path)
        elif kind == "stat":
            known[f"stat\t{path}"] = files.identity(path, follow_last=False) + "/" + files.identity(path)
        elif kind == "list":
            known[f"list\t{path}"] = files.listing(path)
        elif kind == "field":
            source, _, field = path.partition("\t")
            known[f"field\t{path}"] = fields.identity(source, field)
    return known


def _is_the_runs_own(path: str, files: ImageFiles) -> bool:
    """A path the check's container made or the kernel serves, not one the image holds."""
    if path.startswith(_KERNEL_ROOTS) or path in ("/proc", "/sys", "/dev"):
        return True
    return path.startswith(_SCRATCH_ROOTS) and files.identity(path, follow_last=False) == ABSENT


class _FieldReader:
    """A part of a JSON file in the image (the stack description), as a digest: the tracer names it by
    its keys and indexes, "#length" for a list's length and "#keys" for a mapping's names."""

    def __init__(self, files: ImageFiles) -> None:
        self.files = files
        self.documents: dict[str, object] = {}

    def identity(self, source: str, field: str) -> str:
        if source not in self.documents:
            data = self.files.read_small(source)
            try:
                self.documents[source] = json.loads(data) if data is not None else None
            except ValueError:
                self.documents[source] = None
        document = self.documents[source]
        try:
            path = json.loads(field)
        except ValueError:
            path = None
        if not isinstance(document, dict) or not isinstance(path, list):
            return self.files.identity(source)
        value: object = document
        for part in path:
            if part == "#length" and isinstance(value, list):
                value = len(value)
            elif part == "#keys" and isinstance(value, dict):
                value = sorted(value)
            elif isinstance(value, dict) and isinstance(part, str) and part in value:
                value = value[part]
            elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
                value = value[part]
            else:
                return ABSENT
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class KeyedResults:
    """Records of one stack's checks under `directory`: <check>.json, the newest first; then the runs
    committed beside the stack's build report (`committed`), for a host that has none of its own."""

    def __init__(self, directory: Path, committed: Path | None = None) -> None:
        self.directory = directory
        self.committed = read_committed(committed) if committed is not None else {}

    def _own_records(self, check: str) -> list[dict]:
        try:
            document = json.loads((self.directory / f"{check}.json").read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            return []
        return [record for record in document.get("records", []) if isinstance(record, dict)]

    def _records(self, check: str) -> list[dict]:
        return [*self._own_records(check), *self.committed.get(check, [])]

    def reusable(self, check: str, files: ImageFiles, settings: str) -> dict | None:
        """A passing run whose reads are all the same in `files` (its record), else None."""
        for record in self._records(check):
            reads = record.get("reads") or {}
            if not isinstance(reads, dict) or not reads or reads.get("settings") != settings:
                continue
            if not _same_in(reads, files, settings):
                continue
            results = results_of(record)
            if results and all(result.status != smoke_report.FAIL for result in results):
                return record
        return None

    def record(self, check: str, image_id: str, reads: dict[str, str],
               results: list[smoke_report.Result]) -> dict:
        """The run's record; kept only when its every result passed or was skipped."""
        entry = {"image": image_id, "reads": reads,
                 "results": [{"check": r.check, "status": r.status, "detail": r.detail} for r in results]}
        if any(result.status == smoke_report.FAIL for result in results):
            return entry
        records = [entry, *(r for r in self._own_records(check) if r.get("reads") != reads)][:KEPT_PER_CHECK]
        self.directory.mkdir(parents=True, exist_ok=True)
        file_writes.write_atomic(self.directory / f"{check}.json",
                                 json.dumps({"format": _FORMAT, "records": records}, sort_keys=True))
        return entry


def results_of(record: Mapping[str, object]) -> list[smoke_report.Result]:
    try:
        return [smoke_report.Result(row["check"], row["status"], row["detail"]) for row in record["results"]]
    except (KeyError, TypeError):
        return []


def committed_path(reports: Path, stack: str) -> Path:
    return reports / f"{stack}{COMMITTED_SUFFIX}"


def write_committed(path: Path, answers: Mapping[str, Mapping[str, object]]) -> None:
    """The record that answered each check, one per check: the reads grouped under their identity (a
    layer's files share one), JSON with sorted keys, gzip with no name and no time: the same answers
    give the same bytes."""
    checks = {}
    for check, record in sorted(answers.items()):
        grouped: dict[str, list[str]] = {}
        for read, identity in sorted(record["reads"].items()):
            grouped.setdefault(identity, []).append(read)
        checks[check] = {"image": record["image"], "results": record["results"], "reads": grouped}
    text = json.dumps({"format": _FORMAT, "checks": checks}, sort_keys=True, separators=(",", ":"))
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as compressed:
        compressed.write(text.encode())
    file_writes.write_atomic(path, buffer.getvalue())


def read_committed(path: Path) -> dict[str, list[dict]]:
    """{check: [record]} from a committed file; nothing from one that is absent, damaged or of another format."""
    try:
        document = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError, gzip.BadGzipFile):
        return {}
    if not isinstance(document, dict) or document.get("format") != _FORMAT or not isinstance(document.get("checks"), dict):
        return {}
    answers: dict[str, list[dict]] = {}
    for check, entry in document["checks"].items():
        grouped = entry.get("reads") if isinstance(entry, dict) else None
        if not isinstance(grouped, dict):
            continue
        reads = {read: identity for identity, group in grouped.items() if isinstance(group, list) for read in group}
        answers[check] = [{"image": entry.get("image", ""), "reads": reads, "results": entry.get("results")}]
    return answers


def _same_in(reads: Mapping[str, str], files: ImageFiles, settings: str) -> bool:
    """Whether every read kept in a record has the same identity in `files`."""
    if "image" in reads and reads["image"] != ",".join(files.diff_ids):
        return False
    parsed = Reads(frozenset(tuple(key.split("\t", 1)) for key in reads if "\t" in key), True)
    now = identities(parsed, files, settings)
    return all(now.get(key) == value for key, value in reads.items() if key != "image")
