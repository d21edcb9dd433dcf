"""The shape of matrix.toml: allowed keys, their types, which are required.

`check(document)` returns every problem as (key path, message); the matrix
loader turns the path into a file:line. Kept apart from loading so the schema
reads as data.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    kind: object  # a type, a tuple of types, a Table, a TableMap or a ListOf
    required: bool = False


@dataclass(frozen=True)
class Table:
    fields: dict  # key -> Field
    # Required keys may come from elsewhere (a stack's axes): checked after merging instead.
    defer_required: bool = False


@dataclass(frozen=True)
class TableMap:
    """A table whose keys are free names (base names, serve modes) mapping to one shape."""

    value: object


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class AnyTable:
    """A table of free keys to scalar values (environment, server args)."""

    value_types: tuple


_STR_LIST = ListOf(str)
_SCALAR = (str, int, float, bool)

PACKAGE = Table({
    "version": Field(str, required=True),
    "index": Field(str),
    "url": Field(str),
})

SERVE_MODE = Table({
    "args": Field(AnyTable(_SCALAR + (list,)), required=True),
    "reasons": Field(AnyTable((str,))),
    "env": Field(AnyTable((str,))),
    "requires_draft_model": Field(bool),
})

# Fields a stack may set; an axis value may set any of these except the identity ones.
STACK_FIELDS = {
    "name": Field(str, required=True),
    "description": Field(str),
    "replaces": Field(str),
    "cuda": Field(str, required=True),
    "base": Field(str, required=True),
    "base_source": Field(str),
    "target_arch": Field(_STR_LIST, required=True),
    "patched": Field(_STR_LIST),
    "jit_device_code": Field(AnyTable((str,))),
    "packages": Field(TableMap(PACKAGE), required=True),
    "overrides": Field(ListOf(Table({
        "package": Field(str, required=True),
        "declared_by": Field(str, required=True),
        "reason": Field(str, required=True),
    }))),
    "serve": Field(Table({
        "cache_dir": Field(str, required=True),
        "env": Field(AnyTable((str,))),
        "modes": Field(TableMap(SERVE_MODE), required=True),
    }), required=True),
    "bench": Field(Table({
        "input_len": Field(int, required=True),
        "output_len": Field(int, required=True),
        "num_prompts": Field(int, required=True),
        "regression_tolerance": Field(float, required=True),
    }), required=True),
}
AXIS_FIELDS = {k: v for k, v in STACK_FIELDS.items() if k not in ("name",)}

# Optional, where the archive is not the distribution's default (a mirror of one's own, a test's loopback
# archive): the apt source lines, the keyring that signs them, the snapshot archive's URL template.
APT_SOURCE_FIELDS = {
    "sources": Field(_STR_LIST),
    "keyring": Field(str),
    "snapshot": Field(str),
}

MATRIX = Table({
    "schema": Field(int, required=True),
    "defaults": Field(Table({
        "source_date_epoch": Field(int, required=True),
        "base_source": Field(str),
        "repository": Field(str, required=True),
        # The project's public repository URL for the image's source label; the clone's remote never is.
        "source_url": Field(str),
    }), required=True),
    "bases": Field(TableMap(Table({
        "image": Field(str, required=True),
        "cuda": Field(str, required=True),
        "python": Field(str, required=True),
        "venv_python": Field(str, required=True),
        "system_packages": Field(_STR_LIST),
        # The archive system_packages come from (builder/config/apt_archives.toml names its keyring).
        "distribution": Field(str),
        "suite": Field(str),
        **APT_SOURCE_FIELDS,
    })), required=True),
    "local_base": Field(Table({
        "name": Field(str, required=True),
        "suite": Field(str, required=True),
        "python": Field(str, required=True),
        "venv_python": Field(str, required=True),
        "packages": Field(_STR_LIST, required=True),
        "distribution": Field(str),
        **APT_SOURCE_FIELDS,
    }), required=True),
    "stack": Field(ListOf(Table({
        **STACK_FIELDS,
        "axes": Field(TableMap(TableMap(Table(AXIS_FIELDS)))),
    }, defer_required=True)), required=True),
})

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "an array"}


def _type_name(kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(dict.fromkeys(_type_name(k) for k in kind))
    if isinstance(kind, (Table, TableMap, AnyTable)):
        return "a table"
    if isinstance(kind, ListOf):
        return "an array"
    return _TYPE_NAMES.get(kind, kind.__name__)


def _is_instance(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # TOML integers are fine where a float is asked; booleans are never numbers.
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def check(value, shape, path=(), require=True) -> list[tuple[tuple, str]]:
    """Problems with `value` against `shape`; `require=False` skips required-key checks."""
    if isinstance(shape, Table):
        require = require and not shape.defer_required
        if not isinstance(value, dict):
            return [(path, f"'{_dotted(path)}' must be a table")]
        problems = []
        for key, item in value.items():
            if key not in shape.fields:
                problems.append((path + (key,), _unknown_key(key, shape.fields, path)))
                continue
            problems += check(item, shape.fields[key].kind, path + (key,), require)
        if require:
            for key, spec in shape.fields.items():
                if spec.required and key not in value:
                    problems.append((path, f"missing required key '{_dotted(path + (key,))}'"))
        return problems
    if isinstance(shape, TableMap):
        if not isinstance(value, dict):
            return [(path, f"'{_dotted(path)}' must be a table")]
        return [p for key, item in value.items() for p in check(item, shape.value, path + (key,), require)]
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return [(path, f"'{_dotted(path)}' must be an array")]
        return [p for index, item in enumerate(value) for p in check(item, shape.item, path + (index,), require)]
    if isinstance(shape, AnyTable):
        if not isinstance(value, dict):
            return [(path, f"'{_dotted(path)}' must be a table")]
        return [
            (path + (key,), f"'{_dotted(path + (key,))}' must be {_type_name(shape.value_types)}")
            for key, item in value.items()
            if not _is_instance(item, shape.value_types)
        ]
    if not _is_instance(value, shape):
        return [(path, f"'{_dotted(path)}' must be {_type_name(shape)}, not {type(value).__name__}")]
    return []


def _unknown_key(key: str, fields: dict, path) -> str:
    message = f"unknown key '{_dotted(path + (key,))}'"
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    return message + (f" (did you mean '{close[0]}'?)" if close else "")


def _dotted(path) -> str:
    parts = []
    for part in path:
        if isinstance(part, int):
            parts[-1] = f"{parts[-1]}[{part}]" if parts else f"[{part}]"
        else:
            parts.append(str(part))
    return ".".join(parts)
