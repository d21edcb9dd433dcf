"""matrix.lock: what each stack resolved to and what became of its image.

Per stack row: the base image and digest, SOURCE_DATE_EPOCH, the row's input hash, every Python
distribution (version, sha256 of the wheel installed, every fitting wheel's sha256, source, install
group), the image (id, digest, tags, build report, SBOM), the smoke result, the push, the bench
figures (reference baselines and measurements, each with hardware and model) and a status:

    resolved      `builder lock` hashed the pins; no image yet
    smoke-passed  `builder build` recorded an image that passed its smoke checks (nothing else is recorded)
    built         the recorded image failed a later smoke run
    pinned        `builder pin` promoted it (smoke passed; reference figures recorded)

Every change is a read-modify-write under an exclusive flock on a sidecar file (two writers both
land), and the file is replaced atomically (temp file, fsync, rename): a crash leaves the old lock.
JSON with sorted keys and no wall-clock times, so the same facts give the same bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from builder.errors import BuildFailure, UserError
from builder.files import TEMP_SUFFIX, write_atomic
from builder.publish import base_digest as registry_base
from builder.publish import debian_archive
from builder.publish import system_packages as locked_debs
from builder.publish.resolve import Resolution, resolve
from builder.config.stack import GROUP_ORDER, Stack

SCHEMA = 1
FILE_NAME = "matrix.lock"


# --- file access -------------------------------------------------------------------------------


def read(path: Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"schema": SCHEMA, "stacks": {}}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if data.get("schema") != SCHEMA:
        raise UserError(f"{path}: unsupported lock schema {data.get('schema')!r} (expected {SCHEMA})")
    return data


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    sidecar = path.with_name(path.name + ".lck")
    with open(sidecar, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def update(change: Callable[[dict], object], path: Path) -> dict:
    """Apply `change` to the lock's data and write the result, holding the writers' lock throughout.
    When `change` raises, nothing is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        _remove_stale_temporaries(path)
        data = read(path)
        change(data)
        text = dumps(data)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            write_atomic(path, text)
    return data


def _remove_stale_temporaries(path: Path) -> None:
    """Left by a writer that died before its rename; no writer is active while we hold the lock."""
    for leftover in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


def _name(stack: Stack | str) -> str:
    return stack if isinstance(stack, str) else stack.name


def entry(stack: Stack | str, path: Path) -> dict | None:
    return read(path)["stacks"].get(_name(stack))


def _entry_in(data: dict, stack: Stack | str) -> dict:
    name = _name(stack)
    found = data["stacks"].get(name)
    if found is None:
        raise UserError(f"{name} is not in matrix.lock: run `builder lock --stack {name}` first")
    return found


def _relative(path: str | Path | None, lock_path: Path) -> str | None:
    """Paths inside the project (the lock's directory) are stored relative to it, so the lock reads
    the same anywhere."""
    if path is None:
        return None
    path = Path(path)
    if path.is_absolute():
        with contextlib.suppress(ValueError):
            return path.relative_to(Path(lock_path).resolve().parent).as_posix()
    return path.as_posix()


# --- resolution ------------------------------------------------------------------------------


def pins_hash(stack: Stack) -> str:
    """Hash of what a resolution depends on: the python, the pins with their sources, the overrides."""
    inputs = {
        "python": stack.python,
        "packages": [asdict(p) for p in stack.packages],
        "overrides": [asdict(o) for o in stack.overrides],
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _distributions(resolution: Resolution) -> dict:
    return {
        d.name: {
            "version": d.version,
            "sha256": d.sha256,
            "wheel": d.wheel,
            "hashes": list(d.hashes),
            "source": d.source,
            "group": d.group,
            **({"url": d.url} if d.url else {}),
        }
        for d in resolution.distributions
    }


def lock_stacks(
    stacks: tuple[Stack, ...] | list[Stack],
    path: Path,
    resolver: Callable[[Stack], Resolution] = resolve,
    references: dict[str, list[dict]] | None = None,
    base_resolver: Callable[[str], str] = registry_base.resolve,
    apt_resolver: Callable[..., locked_debs.SystemPackages] = debian_archive.resolve,
) -> list[str]:
    """Resolve every stack and its registry base's digest, then record them all in one write: one
    unreachable index or registry and nothing is written. An image built from the same distributions
    on the same base keeps its record; otherwise the entry starts over at `resolved`. Returns a line
    per stack for the user."""
    resolutions = [(stack, resolver(stack)) for stack in stacks]
    digests = _registry_base_digests(stacks, base_resolver)
    system = _system_packages(stacks, apt_resolver)
    lines: list[str] = []

    def change(data: dict) -> None:
        for stack, resolution in resolutions:
            previous = data["stacks"].get(stack.name)
            distributions = _distributions(resolution)
            fresh = {
                "stack": stack.name,
                "pins_hash": pins_hash(stack),
                "python": resolution.python,
                "platform": resolution.platform,
                "indexes": list(resolution.indexes),
                "index_strategy": resolution.index_strategy,
                "overrides": [
                    {**asdict(o), "version": stack.package(o.package).version} for o in stack.overrides
                ],
                "base": {"name": stack.base.name, "image": stack.base.image,
                         "digest": digests.get(stack.base.image, ""), "local": stack.base.local},
                "source_date_epoch": stack.source_date_epoch,
                "distributions": distributions,
                locked_debs.LOCK_KEY: system[stack.name].to_dict() if stack.name in system else None,
                "resolution_hash": hashlib.sha256(json.dumps(distributions, sort_keys=True).encode()).hexdigest(),
                "status": "resolved",
                "image": None,
                "smoke": None,
                "push": None,
                "bench": {"reference": (references or {}).get(stack.name, []), "measured": []},
            }
            same_debs = bool(previous) and previous.get(locked_debs.LOCK_KEY) == fresh[locked_debs.LOCK_KEY]
            if stack.base.local and previous and _same_base(previous["base"], fresh["base"]) and same_debs:
                fresh["base"]["digest"] = previous["base"]["digest"]  # what `builder base` made and recorded
            if not same_debs and fresh[locked_debs.LOCK_KEY]:
                lines.extend(_moved_lines(stack, previous or {}, system[stack.name]))
            unchanged = bool(previous) and previous.get("resolution_hash") == fresh["resolution_hash"] \
                and previous.get("base") == fresh["base"] and same_debs
            if unchanged:
                for key in ("status", "image", "smoke", "push"):
                    fresh[key] = previous.get(key)
                fresh["bench"]["measured"] = previous.get("bench", {}).get("measured", [])
                if previous.get("status") == "pinned":
                    fresh["pinned"] = previous.get("pinned")
            data["stacks"][stack.name] = fresh
            verb = "unchanged" if unchanged else "resolved"
            lines.append(f"{stack.name}: {verb}, {len(distributions)} distributions "
                         f"({_group_counts(distributions)}), status {fresh['status']}")

    update(change, path)
    return lines


def _registry_base_digests(stacks, base_resolver: Callable[[str], str]) -> dict[str, str]:
    """{image: manifest digest} of every registry base the stacks name, each asked once."""
    digests: dict[str, str] = {}
    for stack in stacks:
        if not stack.base.local and stack.base.image not in digests:
            try:
                digests[stack.base.image] = base_resolver(stack.base.image)
            except UserError as error:
                raise UserError(f"{stack.name}: {error}; nothing was locked") from None
    return digests


def _system_packages(stacks, apt_resolver) -> dict[str, locked_debs.SystemPackages]:
    """{row: its locked .debs} for every row whose base names system packages, each archive state read once."""
    by_spec: dict = {}
    for stack in stacks:
        if stack.base.apt is not None and stack.base.apt not in by_spec:
            try:
                by_spec[stack.base.apt] = apt_resolver(stack.base.apt)
            except UserError as error:
                raise UserError(f"{stack.name}: {error}; nothing was locked") from None
    return {stack.name: by_spec[stack.base.apt] for stack in stacks if stack.base.apt is not None}


def _moved_lines(stack: Stack, previous: dict, new: locked_debs.SystemPackages) -> list[str]:
    """Each system package whose version moved since the last lock (one line when there was none)."""
    old = locked_debs.from_entry(previous)
    if old is None:
        return [f"{stack.name}: {len(new.packages)} system packages locked from "
                f"{', '.join(archive.line for archive in new.archives)}"]
    changes = locked_debs.version_changes(old, new)
    return [f"{stack.name}: system package {change}" for change in changes]


def _same_base(one: dict, other: dict) -> bool:
    return all(one.get(key) == other.get(key) for key in ("name", "image", "local"))


def _group_counts(distributions: dict) -> str:
    counts = {group: 0 for group in GROUP_ORDER}
    for item in distributions.values():
        counts[item["group"]] += 1
    return ", ".join(f"{group} {count}" for group, count in counts.items())


def base_digest(stack: Stack, found: dict | None) -> str:
    """The base digest the lock entry records for the stack's base (resolved by `builder lock`, or
    made by `builder base`); "" when it records none, or records it for another base."""
    recorded = (found or {}).get("base") or {}
    current = {"name": stack.base.name, "image": stack.base.image, "local": stack.base.local}
    return recorded.get("digest") or "" if _same_base(recorded, current) else ""


def check_current(stack: Stack, path: Path) -> dict:
    """The stack's entry, refusing one resolved from other pins than the stack has now."""
    found = entry(stack, path)
    if found is None:
        raise UserError(f"{stack.name} is not in matrix.lock: run `builder lock --stack {stack.name}`")
    if found.get("pins_hash") != pins_hash(stack):
        raise UserError(f"{stack.name}: matrix.lock was resolved from other pins than matrix.toml has now; "
                        f"run `builder lock --stack {stack.name}`")
    return found


def requirements_for(stack: Stack | str, path: Path) -> dict[str, str] | None:
    """{group: requirements.txt text} for pip --no-index --require-hashes --no-deps, or None when the
    stack was never locked. Given a Stack (not just a name), a stale entry is refused. One hash per
    distribution, the locked file's: the build's wheel directory holds exactly that file, and pip
    must install nothing else. Where each file came from (index, URL) is the wheel cache's business."""
    found = entry(stack, path)
    if found is None:
        return None
    if isinstance(stack, Stack):
        found = check_current(stack, path)
    texts = {}
    for group in GROUP_ORDER:
        members = {name: item for name, item in sorted(found["distributions"].items()) if item["group"] == group}
        lines = [f"# {found['stack']}, install group {group}: generated from matrix.lock (`builder lock`).",
                 "# The lock holds the whole closure: install with --no-index --require-hashes --no-deps."]
        for name, item in members.items():
            lines.append(f"{name}=={item['version']} \\\n    --hash=sha256:{item['sha256']}")
        texts[group] = "\n".join(lines) + "\n"
    return texts


# --- image lifecycle -------------------------------------------------------------------------


def record_base(base_name: str, digest: str, path: Path) -> list[str]:
    """The digest `builder base` made the local base with, in every locked stack built on it; returns
    those stacks."""
    updated: list[str] = []

    def change(data: dict) -> None:
        for name, found in sorted(data["stacks"].items()):
            if found.get("base", {}).get("name") == base_name:
                found["base"]["digest"] = digest
                updated.append(name)

    update(change, path)
    return updated


@dataclass(frozen=True)
class ImageRecord:
    """A built image as the lock keeps it: what it is, what it was made from, where its records are."""

    image_id: str
    tags: tuple[str, ...]  # the immutable tag first, then moving ones
    inputs_hash: str
    base_digest: str
    source_date_epoch: int
    report: str  # paths relative to the project
    provenance: str
    sbom: str | None = None


def record_build(stack: Stack | str, image: ImageRecord, smoke: dict, path: Path) -> None:
    """A built image that passed its smoke checks, recorded in one write. Rebuilding the image the lock
    already records keeps what was learnt about it (push, measurements, pin); a new image starts over."""
    if not image.tags:
        raise ValueError("record_build needs the immutable tag")

    def change(data: dict) -> None:
        found = _entry_in(data, stack)
        same_image = (found.get("image") or {}).get("id") == image.image_id
        previous = found.get("image") or {}
        found["image"] = {
            "id": image.image_id,
            "digest": previous.get("digest") if same_image else None,
            "immutable_tag": image.tags[0],
            "tags": list(image.tags),
            "inputs_hash": image.inputs_hash,
            "base_digest": image.base_digest,
            "source_date_epoch": image.source_date_epoch,
            "report": image.report,
            "provenance": image.provenance,
            "sbom": image.sbom if image.sbom is not None else (previous.get("sbom") if same_image else None),
        }
        found["smoke"] = {"image_id": image.image_id, "passed": True, "report": smoke}
        found.pop("rejected_candidate", None)
        if not same_image:
            found.update(status="smoke-passed", push=None)
            found.pop("pinned", None)
            found["bench"]["measured"] = []
        elif found.get("status") not in ("smoke-passed", "pinned"):
            found["status"] = "smoke-passed"

    update(change, path)


def record_smoke(
    stack: Stack | str,
    passed: bool,
    report: dict | str | Path | None,
    image_id: str | None = None,
    *,
    path: Path,
) -> None:
    """The smoke result of the recorded image (or of `image_id`: a candidate that was never recorded
    is kept apart and changes nothing else)."""

    def change(data: dict) -> None:
        found = _entry_in(data, stack)
        image = found.get("image")
        result = {"passed": bool(passed),
                  "report": report if isinstance(report, dict) or report is None else _relative(report, path)}
        if image is None or (image_id is not None and image_id != image["id"]):
            found["rejected_candidate"] = {"image_id": image_id, **result}
            return
        found["smoke"] = {"image_id": image["id"], **result}
        if not passed:
            found.pop("pinned", None)
        found["status"] = "smoke-passed" if passed else "built"

    update(change, path)


def record_push(stack: Stack | str, registry: str, repository: str, tag: str, digest: str, *,
                path: Path) -> None:
    def change(data: dict) -> None:
        found = _entry_in(data, stack)
        found["push"] = {
            "registry": registry,
            "repository": repository,
            "tag": tag,
            "digest": digest,
            "reference": f"{registry}/{repository}@{digest}",
        }
        if found.get("image"):
            found["image"]["digest"] = digest

    update(change, path)


def bench_figure(report: dict, report_path: str | Path | None = None, lock_path: Path | None = None) -> dict:
    """A measured figure from a bench report (builder/runtime/bench.py, schema 1)."""
    try:
        gpus = list(report["gpus"])
        figure = {
            "mode": report["mode"],
            "tok_s": float(report["tok_s"]),
            "ttft_ms": report.get("ttft_ms"),
            "model": report.get("model") or "unrecorded",
            "hardware": _hardware(gpus),
            "verdict": report.get("verdict"),
            "reference_tok_s": report.get("reference_tok_s"),
            "workload": report.get("workload"),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"{report_path or 'bench report'}: not a bench report ({error})") from None
    if report_path is not None:
        figure["report"] = _relative(report_path, lock_path) if lock_path else Path(report_path).as_posix()
    return figure


def _hardware(gpus: list[str]) -> str:
    if not gpus:
        return "unrecorded"
    names = sorted(set(gpus))
    return ", ".join(f"{gpus.count(name)}x {name}" for name in names)


def record_bench(stack: Stack | str, report: dict, report_path: str | Path | None = None, *,
                 path: Path) -> dict:
    """A measured bench figure for the recorded image; replaces an earlier one of the same mode,
    hardware and model."""
    figure = bench_figure(report, report_path, path)
    if report.get("stack") not in (None, _name(stack)):
        raise UserError(f"{report_path or 'bench report'}: measured {report['stack']}, not {_name(stack)}")

    def change(data: dict) -> None:
        found = _entry_in(data, stack)
        if not found.get("image"):
            raise UserError(f"{_name(stack)}: no image recorded; build or pull it first")
        key = (figure["mode"], figure["hardware"], figure["model"])
        measured = [f for f in found["bench"]["measured"] if (f["mode"], f["hardware"], f["model"]) != key]
        found["bench"]["measured"] = sorted([*measured, {**figure, "image_id": found["image"]["id"]}],
                                            key=lambda f: (f["mode"], f["hardware"], f["model"]))

    update(change, path)
    return figure


def pin(stack: Stack | str, references: list[dict], path: Path) -> dict:
    """Promote the stack's image to `pinned`: only one whose smoke checks passed, and none with a
    measured bench regression. The reference figures become its recorded baselines."""
    pinned: dict = {}

    def change(data: dict) -> None:
        found = _entry_in(data, stack)
        name = _name(stack)
        image, smoke = found.get("image"), found.get("smoke")
        if not image:
            raise UserError(f"{name} cannot be pinned: no image was built (status {found['status']})")
        if not smoke or not smoke.get("passed") or smoke.get("image_id") != image["id"]:
            raise UserError(f"{name} cannot be pinned: its image {image['id']} has not passed smoke "
                            f"(status {found['status']})")
        regressions = [f["mode"] for f in found["bench"]["measured"] if f.get("verdict") == "regression"]
        if regressions:
            raise BuildFailure(f"{name} cannot be pinned: bench regression in {', '.join(sorted(regressions))}")
        found["bench"]["reference"] = references
        found["status"] = "pinned"
        found["pinned"] = {"image_id": image["id"], "digest": image.get("digest")}
        pinned.update(found)

    update(change, path)
    return pinned


def pin_stack(stack: Stack | str, references: list[dict], bench_reports: list[str | Path] = (), *,
              path: Path) -> dict:
    """Record each bench report measured on the image, then pin (a regression refuses the pin,
    but its measurement stays recorded)."""
    for report_path in bench_reports:
        try:
            report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        except OSError as error:
            raise UserError(f"{report_path}: cannot read the bench report: {error.strerror}") from None
        except json.JSONDecodeError as error:
            raise UserError(f"{report_path}:{error.lineno}: not valid JSON ({error.msg})") from None
        record_bench(stack, report, report_path, path=path)
    return pin(stack, references, path)
