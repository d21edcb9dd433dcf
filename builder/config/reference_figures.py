"""Reference bench figures (bench/reference.toml): data, not code, copied into matrix.lock."""

from __future__ import annotations

import tomllib
from pathlib import Path

from builder.errors import UserError
from builder.config.stack import Stack

SCHEMA = 1
_REQUIRED = {"stack": str, "mode": str, "tok_s": (int, float), "hardware": str, "model": str, "baseline": bool}
_OPTIONAL = {"attention_backend": str, "note": str}


def load(path: Path, stacks: tuple[Stack, ...] | None = None) -> dict[str, list[dict]]:
    """{stack row: [figure, ...]} sorted by mode and tok/s, each figure's hardware spelled out.
    With `stacks`, a figure for an unknown row or serve mode is an error."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"{path}: cannot read the reference figures: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: TOML syntax error: {error}") from None
    if document.get("schema") != SCHEMA:
        raise UserError(f"{path}: unsupported schema {document.get('schema')!r} (expected {SCHEMA})")
    hardware = document.get("hardware", {})
    modes = {s.name: {m.name for m in s.serve.modes} for s in stacks} if stacks is not None else None
    figures: dict[str, list[dict]] = {}
    for number, figure in enumerate(document.get("figure", []), start=1):
        where = f"{path}: figure {number}"
        for key, kind in _REQUIRED.items():
            if not isinstance(figure.get(key), kind):
                raise UserError(f"{where}: `{key}` missing or not a {_kind_name(kind)}")
        unknown = set(figure) - set(_REQUIRED) - set(_OPTIONAL)
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if figure["tok_s"] <= 0:
            raise UserError(f"{where}: tok_s must be positive, not {figure['tok_s']}")
        if figure["hardware"] not in hardware:
            raise UserError(f"{where}: hardware {figure['hardware']!r} is not described under [hardware]")
        if modes is not None:
            if figure["stack"] not in modes:
                raise UserError(f"{where}: unknown stack row {figure['stack']!r}")
            if figure["mode"] not in modes[figure["stack"]]:
                raise UserError(f"{where}: {figure['stack']} has no serve mode {figure['mode']!r}")
        figures.setdefault(figure["stack"], []).append(
            {**{k: v for k, v in figure.items() if k != "stack"}, "tok_s": float(figure["tok_s"]),
             "hardware": dict(hardware[figure["hardware"]])}
        )
    for name, items in figures.items():
        for mode in {f["mode"] for f in items}:
            if sum(f["baseline"] for f in items if f["mode"] == mode) != 1:
                raise UserError(f"{path}: {name} mode {mode} needs exactly one figure with baseline = true")
        items.sort(key=lambda f: (f["mode"], not f["baseline"], -f["tok_s"]))
    return figures


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}
    return " or ".join(sorted({names[k.__name__] for k in kinds}))
