"""TOML text for the small values the builder writes (generated facts, candidate stacks): strings,
numbers, booleans, lists and inline tables. tomllib reads; nothing in the standard library writes."""

from __future__ import annotations

import json
import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name, ensure_ascii=False)


def value(item) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, float)):
        return repr(item)
    if isinstance(item, str):
        # JSON's escapes are a subset of TOML basic strings' (json.dumps never writes "\/").
        return json.dumps(item, ensure_ascii=False)
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(i) for i in item) + "]"
    if isinstance(item, dict):
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + " }" if item else "{}"
    raise TypeError(f"no TOML form for {type(item).__name__}")


def table(header: str, items: dict) -> str:
    lines = [header] + [f"{key(k)} = {value(v)}" for k, v in items.items()]
    return "\n".join(lines) + "\n"
