"""Reference bench figures (bench/reference.toml): data, not code, as the deployment recorded them.

Copied into matrix.lock by `builder lock` / `builder pin`, and into each image's stack.json by
`builder render`, where `bench` picks the figure to judge a mode against.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from builder.errors import UserError
from builder.config.stack import Stack

SCHEMA = 2
NOT_RECORDED = "not recorded"
_REQUIRED = {"stack": str, "mode": str, "attention_backend": str, "tok_s": (int, float), "model": str,
             "hardware": str, "source": str, "pinned": bool}
_OPTIONAL = {"note": str}


def backend_name(attention_backend: str) -> str | None:
    """'likely flashinfer' -> 'flashinfer'; None for 'not recorded'."""
    if attention_backend == NOT_RECORDED:
        return None
    return attention_backend.removeprefix("likely ")


def load(path: Path, stacks: tuple[Stack, ...] | None = None) -> dict[str, list[dict]]:
    """{stack row: [figure, ...]} sorted by mode, pinned first, each figure's hardware spelled out.
    With `stacks`, a figure for an unknown row or serve mode is an error, and so is a pinned figure
    measured with another attention backend than its mode runs."""
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
    modes = {s.name: {m.name: m for m in s.serve.modes} for s in stacks} if stacks is not None else None
    figures: dict[str, list[dict]] = {}
    for number, figure in enumerate(document.get("figure", []), start=1):
        where = f"{path}: figure {number}"
        for key, kind in _REQUIRED.items():
            if not isinstance(figure.get(key), kind) or (kind == (int, float) and isinstance(figure[key], bool)):
                raise UserError(f"{where}: `{key}` missing or not a {_kind_name(kind)}")
        unknown = set(figure) - set(_REQUIRED) - set(_OPTIONAL)
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if figure["tok_s"] <= 0:
            raise UserError(f"{where}: tok_s must be positive, not {figure['tok_s']}")
        if figure["hardware"] not in hardware:
            raise UserError(f"{where}: hardware {figure['hardware']!r} is not described under [hardware]")
        if modes is not None:
            _check_against_matrix(where, figure, modes)
        figures.setdefault(figure["stack"], []).append(
            {**figure, "tok_s": float(figure["tok_s"]), "hardware": dict(hardware[figure["hardware"]])})
    for name, items in figures.items():
        for mode in {f["mode"] for f in items}:
            if sum(f["pinned"] for f in items if f["mode"] == mode) > 1:
                raise UserError(f"{path}: {name} mode {mode} has more than one figure with pinned = true")
        items.sort(key=lambda f: (f["mode"], not f["pinned"], -f["tok_s"]))
    return figures


def _check_against_matrix(where: str, figure: dict, modes: dict) -> None:
    if figure["stack"] not in modes:
        raise UserError(f"{where}: unknown stack row {figure['stack']!r}")
    mode = modes[figure["stack"]].get(figure["mode"])
    if mode is None:
        raise UserError(f"{where}: {figure['stack']} has no serve mode {figure['mode']!r}")
    measured, runs = backend_name(figure["attention_backend"]), mode.args.get("attention_backend")
    if figure["pinned"] and measured and runs and measured != runs:
        raise UserError(f"{where}: pinned, but measured with attention backend {measured} while mode "
                        f"{mode.name} runs {runs}")


def pinned(figures: dict[str, list[dict]], row: str | None, mode: str) -> dict | None:
    """The figure `bench` judges `mode` of `row` against, or None."""
    return next((f for f in figures.get(row or "", []) if f["mode"] == mode and f["pinned"]), None)


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}
    return " or ".join(sorted({names[k.__name__] for k in kinds}))
