"""The expanded matrix as a table, JSON, or a GitHub Actions matrix."""

from __future__ import annotations

import json

from builder.config.stack import Stack

_TABLE_PACKAGES = ("torch", "sgl-kernel", "flashinfer-python", "sglang")


def as_json(stacks: tuple[Stack, ...]) -> str:
    return json.dumps([stack.to_dict() for stack in stacks], indent=2, sort_keys=True)


def as_github(stacks: tuple[Stack, ...], base_digests: dict[str, str]) -> str:
    """base_image is what the row's Dockerfile names FROM (by digest once the lock has one)."""
    include = [{"stack": s.name, "cuda": s.cuda, "base": s.base.name,
                "base_image": s.base.reference(base_digests.get(s.name, "")), "local_base": s.base.local}
               for s in stacks]
    return json.dumps({"include": include}, sort_keys=True, separators=(",", ":"))


def as_table(stacks: tuple[Stack, ...], base_digests: dict[str, str]) -> str:
    header = ["stack", "base", "cuda", "python", *_TABLE_PACKAGES, "arch"]
    rows = []
    for stack in stacks:
        versions = [(stack.package(n).version if stack.package(n) else "-") for n in _TABLE_PACKAGES]
        base = stack.base.name + ("" if stack.base.local or base_digests.get(stack.name) else " (unpinned)")
        rows.append([stack.name, base, stack.cuda, stack.python, *versions, ",".join(stack.target_arch)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    for stack in stacks:
        for override in stack.overrides:
            pinned = stack.package(override.package).version
            lines.append(f"override in {stack.name}: {override.package} {pinned} over {override.declared_by}'s "
                         f"{override.package}{override.declared}: {override.reason}")
    return "\n".join(lines)
