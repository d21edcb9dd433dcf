"""`builder bump`: plan the candidate, judge the patches, write the stack next to the old one
(never over it), lock and render its rows, and write the report."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from builder.bump import stack_text
from builder.bump import compat_refresh
from builder.bump.candidate import Planner, RowPlan
from builder.bump.index import Index
from builder.bump.report import markdown
from builder.config import compat, reference_figures
from builder.config.matrix import LOCAL_SUFFIX, Matrix, load_matrix
from builder.config.stack import Package, Stack
from builder.errors import BuildFailure, UserError
from builder.files import write_atomic
from builder.lock import store
from builder.lock import base_digest, debian_archive
from builder.lock.model import DEFAULT_INDEX
from builder.lock.resolution import lock_stacks, record_base
from builder.patches import patch_verdict
from builder.paths import stack_dir
from builder.render import render


@dataclass(frozen=True)
class Outcome:
    name: str
    report: Path
    text: str
    lines: tuple[str, ...]


def _family(matrix: Matrix, name: str) -> list[Stack]:
    rows = [row for row in matrix.registry_stacks if row.family == name]
    if rows:
        return rows
    known = sorted({row.family for row in matrix.registry_stacks})
    raise UserError(f"--from {name}: no stack of that name in {matrix.path.name} (stacks: {', '.join(known)})")


def _candidate_name(family: str, rows: list[Stack], bumps: dict[str, str], given: str | None) -> str:
    if given:
        return given
    for name, version in bumps.items():
        old = rows[0].package(name)
        if old and old.parsed_version.public in family:
            return family.replace(old.parsed_version.public, str(Version(version)))
    raise UserError(f"cannot derive the candidate's name from {family}: give --name")


def _check_name(matrix: Matrix, name: str, plans: list[RowPlan]) -> None:
    taken = {row.name for row in matrix.all_rows()} | {row.family for row in matrix.all_rows()}
    wanted = [name] + [f"{name}-{plan.axis_value}" for plan in plans if plan.axis_value]
    for row_name in wanted:
        if row_name in taken or row_name + LOCAL_SUFFIX in taken:
            raise UserError(f"--name {name}: the name {row_name} is already taken in {matrix.path.name}")
        if (matrix.root / "images" / row_name).exists():
            raise UserError(f"--name {name}: images/{row_name} already exists")


def _override(contradiction, old_stack: Stack, command: str) -> dict:
    old = next((o for o in old_stack.overrides
                if (o.package, o.declared_by) == (contradiction.package, contradiction.declared_by)), None)
    reason = (f"carried from {old_stack.family}: {old.reason}" if old else
              f"{contradiction.package} {contradiction.version} is pinned by `{command}` against "
              f"{contradiction.declared_by} {contradiction.declarer_version}'s {contradiction.declared}; review")
    return {"package": contradiction.package, "declared_by": contradiction.declared_by, "reason": reason}


def _pin(package: Package) -> dict:
    return {"version": package.version, "source": package.source}


def bump(matrix_path: str, pins: list[str], from_stack: str, name: str | None = None,
         index: Index | None = None, lock: bool = True) -> Outcome:
    matrix = load_matrix(matrix_path)
    rows = _family(matrix, from_stack)
    bumps: dict[str, str] = {}
    for text in pins:
        package, version = compat_refresh.parse_pin(text)
        if package in bumps:
            raise UserError(f"{package} is given twice")
        bumps[package] = version
    if not bumps:
        raise UserError("give at least one PACKAGE==VERSION")
    index = index or Index()
    for package, version in bumps.items():
        index.require(package, version)
    candidate = _candidate_name(from_stack, rows, bumps, name)
    _check_name(matrix, candidate, [])
    command = shlex.join(["builder", "bump", *pins, "--from", from_stack] + (["--name", name] if name else []))
    facts = compat_refresh.load()
    planner = Planner(bumps, index, facts)
    plans = [planner.plan_row(row) for row in rows]
    _check_name(matrix, candidate, plans)
    kept = [plan for plan in plans if not plan.refused]
    report_path = matrix.project.reports / f"bump-{candidate}.md"
    notes: list[str] = []
    record = {"name": candidate, "from": from_stack, "command": command, "notes": notes,
              "bumped": [{"name": n, "old": (rows[0].package(n).version if rows[0].package(n) else None), "new": v}
                         for n, v in bumps.items()],
              "rows": [], "verdicts": [], "overrides": [], "facts": {}, "compare_rows": []}
    for plan in kept:
        for package in plan.packages.values():
            if not (package.index or package.url):
                planner.facts_of(package.name, package.version)
    compat_refresh.save(facts)
    compat.compat_data.cache_clear()
    used = {f"{p.name}=={p.parsed_version.public}" for plan in kept for p in plan.packages.values()}
    record["facts"] = {key: facts[key].source + (f"; CUDA {facts[key].cuda}: {facts[key].cuda_source}"
                                                 if facts[key].cuda else "")
                       for key in sorted(used) if key in facts}
    old = rows[0]
    written: list[Path] = []
    patched: list[str] = []
    if kept:
        first = kept[0].packages
        for distribution in old.patched:
            new = first.get(distribution)
            old_version = old.package(distribution).version
            if new is None:
                notes.append(f"{distribution} is no longer pinned: its patch series is not carried")
                continue
            if new.version == old_version:
                patched.append(distribution)
                continue
            verdicts = patch_verdict.judge_series(distribution, old_version, new.version,
                                                  root=matrix.project.patches)
            record["verdicts"] += [v.to_dict() for v in verdicts]
            target = patch_verdict.write_series(distribution, old_version, new.version, verdicts,
                                                matrix.project.patches, report_path.relative_to(matrix.root).as_posix())
            if target:
                written.append(target)
                patched.append(distribution)
            else:
                notes.append(f"{distribution} {new.version}: no patch of its series is carried, so the candidate "
                             "patches nothing there")
    not_carried = [v["name"] for v in record["verdicts"] if v["verdict"] != patch_verdict.CARRIED]
    if not_carried:
        relying = [mode.name for mode in old.serve.modes if any("patch" in r for r in mode.reasons.values())]
        # A reason may point at another mode's ("as in baseline-fusion").
        relying += [mode.name for mode in old.serve.modes if mode.name not in relying
                    and any(f"as in {name}" in r for r in mode.reasons.values() for name in relying)]
        if relying:
            notes.append(f"serve modes {', '.join(relying)} give patches as their reason, and the candidate does "
                         f"not apply {', '.join(not_carried)}: review them before merging")
    for plan in plans:
        row = {"old": plan.old.name, "refused": plan.refused, "decisions": plan.decisions,
               "candidate": f"{candidate}-{plan.axis_value}" if plan.axis_value else candidate,
               "old_pins": {p.name: _pin(p) for p in plan.old.packages},
               "new_pins": {n: _pin(p) for n, p in sorted(plan.packages.items())}}
        old_local = plan.old.name + LOCAL_SUFFIX
        locked_old = store.read(matrix.project.lock)
        row["compare_local"] = old_local if locked_old.get(old_local) else next(
            (r.name + LOCAL_SUFFIX for r in rows if locked_old.get(r.name + LOCAL_SUFFIX)), old_local)
        record["rows"].append(row)
    if not kept:
        _write_report(record, matrix, report_path)
        raise BuildFailure(f"no CUDA row of {from_stack} can take {', '.join(pins)}: "
                           + "; ".join(p.refused for p in plans) + f" (report: {report_path})")
    overrides = {}
    for plan in kept:
        for contradiction in plan.contradictions:
            overrides.setdefault((contradiction.package, contradiction.declared_by),
                                 _override(contradiction, old, command))
    record["overrides"] = list(overrides.values())
    common = {n: p for n, p in kept[0].packages.items() if all(k.packages.get(n) == p for k in kept)}
    axes = [{"value": plan.axis_value, "description": f"{plan.old.name} bumped ({', '.join(pins)})",
             "replaces": plan.old.name, "cuda": plan.old.cuda, "base": plan.old.base.name,
             "packages": {n: p for n, p in plan.packages.items() if n not in common}} for plan in kept]
    lines = matrix.path.read_text(encoding="utf-8").splitlines()
    start, end = stack_text.family_block(lines, from_stack)
    block = stack_text.stack_text(
        name=candidate, description=f"Candidate from {from_stack} ({', '.join(pins)}) by builder bump",
        target_arch=old.target_arch, patched=patched, common=common, overrides=record["overrides"], axes=axes,
        copied=stack_text.copied_sections(lines[start:end]),
        preamble=[f"Candidate written by `{command}`; report: {report_path.relative_to(matrix.root)}.",
                  "Not known-good: only build, smoke and bench on GPUs promote it.",
                  *[f"{v['verdict'].upper()}: {v['distribution']} {v['name']} (patches/{v['distribution']}/"
                    f"{v['old_version']}/{v['name']}; not applied here; the report shows why)"
                    for v in record["verdicts"] if v["verdict"] != patch_verdict.CARRIED]])
    new_text = stack_text.insert_after(matrix.path.read_text(encoding="utf-8"), from_stack, block)
    _write_matrix(matrix, new_text, written)
    record["compare_rows"] = list(dict.fromkeys([r["compare_local"] for r in record["rows"] if not r["refused"]] +
                                                [r["candidate"] + LOCAL_SUFFIX for r in record["rows"] if not r["refused"]]))
    out_lines = [f"wrote {candidate} into {matrix.path.name} after {from_stack}"]
    out_lines += [f"wrote {path.relative_to(matrix.root)}/series" for path in written]
    if lock:
        out_lines += _lock_and_render(matrix_path, candidate, rows, notes)
        record["wheel_bytes"] = _wheel_bytes(matrix.project.lock, record["compare_rows"], index)
    _write_report(record, matrix, report_path)
    text = report_path.read_text(encoding="utf-8")
    return Outcome(candidate, report_path, text, tuple(out_lines))


def _write_matrix(matrix: Matrix, text: str, written: list[Path]) -> None:
    """Validate the new matrix in full before it replaces the old one; on a problem nothing stays."""
    temporary = matrix.path.with_name(f".{matrix.path.name}.bump-{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        load_matrix(temporary, patches_root=matrix.project.patches)
    except UserError as error:
        for path in written:
            shutil.rmtree(path, ignore_errors=True)
        raise BuildFailure(f"the candidate stack does not pass the matrix checks: {error}") from None
    finally:
        temporary.unlink(missing_ok=True)
    write_atomic(matrix.path, text)


def _lock_and_render(matrix_path: str, candidate: str, old_rows: list[Stack], notes: list[str]) -> list[str]:
    matrix = load_matrix(matrix_path)
    rows = [row for row in matrix.all_rows() if row.family == candidate]
    figures = reference_figures.load(matrix.project.reference_figures, stacks=matrix.all_rows())
    lines: list[str] = []
    for row in rows:
        try:
            lines += lock_stacks([row], path=matrix.project.lock, base_resolver=base_digest.resolve,
                                 apt_resolver=debian_archive.resolve, references=figures)
        except UserError as error:
            notes.append(f"{row.name} is not locked here: {error}")
            lines.append(f"{row.name}: not locked ({error})")
    recorded = store.read(matrix.project.lock)
    for old in old_rows:
        found = recorded.get(old.name + LOCAL_SUFFIX)
        if found and found.resolution.base.pin:
            record_base(found.resolution.base.name, found.resolution.base.pin, matrix.project.lock)
            break
    files = render.render_all(tuple(rows), matrix.project)
    changed = render.write(files, matrix.root)
    lines.append(f"rendered {len(changed)} files under {', '.join(stack_dir(r) for r in rows)}")
    return lines


def _wheel_bytes(lock_path: Path, names: list[str], index: Index) -> dict[str, int]:
    """What each row's locked wheels weigh on the default index (sizes from its file list): the download
    a cold build makes, known before anything is built. Rows with wheels from elsewhere are left out."""
    lock = store.read(lock_path)
    sizes: dict[str, int] = {}
    for name in names:
        found = lock.get(name)
        if found is None:
            continue
        total = 0
        for item in found.resolution.distributions:
            project = index.project(item.name) if item.source == DEFAULT_INDEX else None
            size = next((f.size for f in project.files if f.filename == item.wheel), 0) if project else 0
            if not size:
                break
            total += size
        else:
            sizes[name] = total
    return sizes


def _write_report(record: dict, matrix: Matrix, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path.with_suffix(".json"), json.dumps(record, indent=2, sort_keys=True) + "\n")
    write_atomic(path, markdown(record, matrix.root, matrix.project.lock))


def report(matrix_path: str, candidate: str) -> Outcome:
    """The report again, from the bump's record and what the lock and build reports say now."""
    matrix = load_matrix(matrix_path)
    path = matrix.project.reports / f"bump-{candidate}.md"
    try:
        record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"no bump record {path.with_suffix('.json')}: run `builder bump` first") from None
    _write_report(record, matrix, path)
    return Outcome(candidate, path, path.read_text(encoding="utf-8"), ())


def default_index_rows(matrix_path: str, candidate: str) -> list[str]:
    """The candidate's rows on the local base whose every pin comes from the default index: the rows a
    runner with no other source, or this machine, can build."""
    matrix = load_matrix(matrix_path)
    return [row.name for row in matrix.local_stacks
            if row.family == candidate and all(not (p.index or p.url) for p in row.packages)]
