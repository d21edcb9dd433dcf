"""The bump report: Markdown for a pull request body and a job summary, from the bump's record
(build-reports/bump-<candidate>.json) and what the lock and the build reports say now, so running it
again after a build adds the image sizes and smoke results."""

from __future__ import annotations

import json
from pathlib import Path

from builder.lock import store
from builder.lock.model import Resolution

STATUS_NOTE = ("A candidate is never known-good by being bumped: its rows stay `resolved` until `builder build` "
               "(smoke checks) and the GPU host's bench and `builder pin` promote them.")


def _resolution(lock, name: str) -> Resolution | None:
    found = lock.get(name) if name else None
    return found.resolution if found else None


def distribution_changes(old: Resolution | None, new: Resolution | None) -> list[str]:
    if old is None or new is None:
        return []
    before = {d.name: d.version for d in old.distributions}
    after = {d.name: d.version for d in new.distributions}
    lines = [f"| added | `{n}` | | {after[n]} |" for n in sorted(after.keys() - before.keys())]
    lines += [f"| removed | `{n}` | {before[n]} | |" for n in sorted(before.keys() - after.keys())]
    lines += [f"| changed | `{n}` | {before[n]} | {after[n]} |" for n in sorted(before.keys() & after.keys())
              if before[n] != after[n]]
    return lines


def _image(root: Path, lock, name: str) -> tuple[str, str]:
    """(size, smoke) of a row's recorded image, or dashes."""
    found = lock.get(name)
    if not found or not found.outcome.image:
        return "not built", "not run"
    size, smoke = "unknown", "unknown"
    try:
        report = json.loads((root / found.outcome.image.report).read_text(encoding="utf-8"))
        size = f"{sum(layer['bytes'] for layer in report['layers']) / 1e9:.2f} GB"
        summary = report["smoke"]["summary"]
        smoke = ("passed" if report["smoke"]["passed"] else "FAILED") + \
            f" ({summary['pass']} pass, {summary['fail']} fail, {summary['skip']} skip)"
    except (OSError, KeyError, TypeError, ValueError):
        pass
    return size, smoke


def markdown(record: dict, root: Path, lock_path: Path) -> str:
    lock = store.read(lock_path)
    out = [f"# Bump: {record['from']} -> {record['name']}", "",
           f"`{record['command']}`", "", STATUS_NOTE, "", "## Versions", "",
           "| distribution | old | new |", "| --- | --- | --- |"]
    out += [f"| `{p['name']}` | {p['old'] or '(not pinned)'} | {p['new']} |" for p in record["bumped"]]
    out += ["", "## CUDA rows", ""]
    for row in record["rows"]:
        if row["refused"]:
            out.append(f"- **{row['old']}: refused.** {row['refused']}")
        else:
            out.append(f"- {row['old']} -> **{row['candidate']}** (and `{row['candidate']}-local` on the local base)")
    for row in record["rows"]:
        if row["refused"]:
            continue
        out += ["", f"### Pins of {row['candidate']}", "", "| distribution | old | new | source |",
                "| --- | --- | --- | --- |"]
        for name in sorted(set(row["old_pins"]) | set(row["new_pins"])):
            old, new = row["old_pins"].get(name), row["new_pins"].get(name)
            if old == new:
                continue
            out.append(f"| `{name}` | {old['version'] if old else ''} | {new['version'] if new else '(removed)'} "
                       f"| {new['source'] if new else old['source']} |")
        compared = row.get("compare_local")
        old_resolution = _resolution(lock, compared)
        new_resolution = _resolution(lock, f"{row['candidate']}-local")
        lines = distribution_changes(old_resolution, new_resolution)
        out += ["", f"Every distribution of the locked closure, `{compared}` -> `{row['candidate']}-local`:", ""]
        if lines:
            out += ["| change | distribution | old | new |", "| --- | --- | --- | --- |", *lines]
        else:
            out.append("(not compared: one of the two rows is not locked here)")
    out += ["", "## Patch verdicts", ""]
    if not record["verdicts"]:
        out.append("No patch series to check.")
    for verdict in record["verdicts"]:
        out += [f"### {verdict['distribution']} {verdict['old_version']} -> {verdict['new_version']}: "
                f"`{verdict['name']}`: **{verdict['verdict']}**", "",
                f"Checked against `{verdict['wheel']}` (sha256 `{verdict['wheel_sha256']}`).", "", "```",
                *verdict["evidence"], "```", ""]
    out += ["## Compatibility decisions", ""]
    for row in record["rows"]:
        if not row["refused"]:
            out += [f"- {row['old']}: {decision}" for decision in row["decisions"]]
    for override in record["overrides"]:
        out.append(f"- override: `{override['package']}` against `{override['declared_by']}`'s requirement: "
                   f"{override['reason']}")
    for note in record["notes"]:
        out.append(f"- {note}")
    out += ["", "Facts used (generated by `builder compat refresh` from the wheels, each with its source):", ""]
    out += [f"- `{key}`: {fact}" for key, fact in sorted(record["facts"].items())]
    out += ["", "## Build and smoke", "", "| row | locked wheels (download) | image size | smoke |",
            "| --- | --- | --- | --- |"]
    for name in record["compare_rows"]:
        size, smoke = _image(root, lock, name)
        wheels = record.get("wheel_bytes", {}).get(name)
        out.append(f"| `{name}` | {f'{wheels / 1e9:.2f} GB' if wheels else 'unknown'} | {size} | {smoke} |")
    out += ["", "## Carried unchanged: review", "",
            "The serve profiles, their reasons and environment, the bench settings and the declared "
            f"JIT-compiled kernels are copied from {record['from']} as they were; their comments may name the old "
            "versions."]
    return "\n".join(out) + "\n"
