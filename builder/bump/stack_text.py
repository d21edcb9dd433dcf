"""The candidate's [[stack]] table as matrix.toml text, inserted after the stack it starts from.

Pins, overrides, axes and the patched list are written from the plan; the serve profiles, bench
settings and declared JIT code are copied from the old stack's text with their comments, so a
reviewer sees them as they were reviewed."""

from __future__ import annotations

import re

from builder.config import toml_write
from builder.config.stack import Package

_HEADER = re.compile(r"^\s*\[")
_STACK = re.compile(r"^\s*\[\[stack\]\]\s*(#.*)?$")
_NAME = re.compile(r'^\s*name\s*=\s*"([^"]*)"')
COPIED_SECTIONS = ("[stack.jit_device_code]", "[stack.serve", "[stack.bench]")


def _package(package: Package) -> dict:
    item = {"version": package.version}
    if package.index:
        item["index"] = package.index
    if package.url:
        item["url"] = package.url
    return item


def family_block(lines: list[str], family: str) -> tuple[int, int]:
    """[start, end) line indexes of the [[stack]] named `family` (leading comments excluded)."""
    headers = [i for i, line in enumerate(lines) if _STACK.match(line)]
    for position, start in enumerate(headers):
        end = headers[position + 1] if position + 1 < len(headers) else len(lines)
        named = next((m.group(1) for line in lines[start + 1:end] if (m := _NAME.match(line))), None)
        if named == family:
            while end > start and (lines[end - 1].lstrip().startswith("#") or not lines[end - 1].strip()) \
                    and end != len(lines):
                end -= 1  # comments above the next [[stack]] belong to it
            return start, end
    raise KeyError(family)


def copied_sections(block: list[str]) -> list[str]:
    """The old block's serve, bench and JIT sections, each with the comment lines right above it."""
    headers = [i for i, line in enumerate(block) if _HEADER.match(line)] + [len(block)]
    chunks = []
    for position, start in enumerate(headers[:-1]):
        if not block[start].strip().startswith(COPIED_SECTIONS):
            continue
        first = start
        while first > 0 and block[first - 1].lstrip().startswith("#"):
            first -= 1
        end = headers[position + 1]
        while end > start + 1 and (block[end - 1].lstrip().startswith("#") or not block[end - 1].strip()):
            end -= 1
        chunks.append("\n".join(block[first:end]).rstrip() + "\n")
    return chunks


def stack_text(*, name: str, description: str, target_arch, patched, common: dict[str, Package],
               overrides: list[dict], axes: list[dict], copied: list[str], preamble: list[str]) -> str:
    """axes: [{"value", "description", "replaces", "cuda", "base", "packages": {name: Package}}]."""
    parts = ["\n".join(f"# {line}" if line else "#" for line in preamble),
             toml_write.table("[[stack]]", {"name": name, "description": description,
                                            "target_arch": list(target_arch), "patched": list(patched)})]
    text = "\n".join(parts)
    for chunk in copied:
        if "[stack.jit_device_code]" in chunk:
            text += "\n" + chunk
    text += "\n" + toml_write.table("[stack.packages]", {n: _package(p) for n, p in sorted(common.items())})
    for override in overrides:
        text += "\n" + toml_write.table("[[stack.overrides]]", override)
    for chunk in copied:
        if "[stack.jit_device_code]" not in chunk:
            text += "\n" + chunk
    for axis in axes:
        items = {"description": axis["description"], "replaces": axis["replaces"], "cuda": axis["cuda"],
                 "base": axis["base"]}
        items.update({f"packages.{toml_write.key(n)}": _package(p) for n, p in sorted(axis["packages"].items())})
        body = [f"[stack.axes.cuda.{toml_write.key(axis['value'])}]"]
        body += [f"{k} = {toml_write.value(v)}" for k, v in items.items()]
        text += "\n" + "\n".join(body) + "\n"
    return text


def insert_after(text: str, family: str, block: str) -> str:
    lines = text.splitlines()
    _, end = family_block(lines, family)
    before, after = lines[:end], lines[end:]
    joined = "\n".join(before).rstrip("\n") + "\n\n" + block.rstrip("\n") + "\n"
    return joined + ("\n" + "\n".join(after) + "\n" if after else "")
