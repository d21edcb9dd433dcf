"""`builder status` as words: one cell text per column (the table, Markdown and the page's plain
parts share them), a terminal table of one line per row, JSON, and Markdown for a job summary."""

from __future__ import annotations

import html
import json
import re

from builder.status.model import Row, Status, short

COLUMNS = ("stack", "state", "image", "tag", "digest", "engine", "base", "smoke", "bench", "patches",
           "newer upstream")


def digest_text(row: Row) -> str:
    if row.manifest_digest:
        return f"sha256:{short(row.manifest_digest)}"
    return "not pushed" if row.image_id else "-"


def engine_text(row: Row) -> str:
    if row.engine:
        return row.engine
    return "not recorded" if row.image_id else "-"


def smoke_text(row: Row) -> str:
    text = row.smoke.describe()
    if row.rejected:
        text += f"; candidate {short(row.rejected.image_id) or '(no id)'} rejected: {row.rejected.describe()}"
    return text


def patch_text(row: Row) -> str:
    return "; ".join(p.describe().replace(".patch:", ":") for p in row.patches) or "none"


def newer_text(row: Row) -> str:
    if row.newer_checked is None:
        return "not checked"
    found = ", ".join(f"{n.package} {n.newest}" for n in row.newer) or "none"
    return f"{found} (checked {row.newer_checked[:10]})"


def cells(row: Row) -> list[str]:
    return [row.stack, row.state, row.short_image or "-", row.immutable_tag or "-", digest_text(row),
            engine_text(row), row.base, smoke_text(row), "; ".join(m.describe() for m in row.modes),
            patch_text(row), newer_text(row)]


NOT_LOOKED_UP = ("upstream: no look-up recorded here (`builder bump --newer PACKAGE` or `builder status "
                 "--refresh-newer` asks pip's default index)")


def upstream_lines(status: Status) -> list[str]:
    lines = []
    for item in status.upstream:
        if item.newest:
            pins = ", ".join(dict.fromkeys(version for _, version in item.pins))
            lines.append(f"upstream {item.package}: {item.newest} on pip's default index (checked "
                         f"{item.checked[:10]}); the rows pin {pins}")
    return lines or [NOT_LOOKED_UP]


def as_table(status: Status) -> str:
    rows = [list(COLUMNS)] + [cells(row) for row in status.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([*lines, *upstream_lines(status)]) + "\n"


def as_json(status: Status) -> str:
    return json.dumps(status.to_dict(), indent=2, sort_keys=True) + "\n"


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|#])")


def _md(text: str) -> str:
    """A value from the lock or the matrix as Markdown table text: nothing in it becomes markup."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _md_cells(row: Row) -> list[str]:
    found = [_md(cell) for cell in cells(row)]
    found[1] = f"**{found[1]}**"
    if row.smoke.outcome == "failed" or row.rejected:
        found[7] = "**" + found[7] + "**"
    found[8] = "<br>".join(("**" + _md(m.describe()) + "**") if m.verdict == "regression" else _md(m.describe())
                           for m in row.modes)
    found[9] = "<br>".join(_md(p.describe()) for p in row.patches) or "none"
    return found


def as_markdown(status: Status) -> str:
    out = ["### Stack rows", "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    out += ["| " + " | ".join(_md_cells(row)) + " |" for row in status.rows]
    upstream = upstream_lines(status)
    if upstream:
        out += ["", *[f"- {_md(line)}" for line in upstream]]
    return "\n".join(out) + "\n"
