"""The stack description baked into every image at /opt/builder/stack.json.

`builder render` writes it from the stack row; the entrypoint and the smoke
checks read it, so nothing inside the image re-derives what the matrix said.

Schema (version 2), every key always present:

    schema          2
    stack           row name, e.g. "sglang-0.5.9-cu130"
    replaces        the row this one replaced ("sglang-0.5.9-cu128"), or null
    cuda            the stack's CUDA version, "13.0.1"
    driver          {"cuda", "minimum", "source"}: the oldest NVIDIA driver that CUDA runs on
                    ("580.82.07") and where that figure comes from
    python          interpreter major.minor the image runs, "3.12"
    target_arch     compute capabilities the stack targets, ["12.0"]
    venv            virtual environment holding every pinned distribution, "/opt/venv"
    distributions   {distribution name: exact pinned version}, e.g. {"torch": "2.9.1+cu130"}
    patches         [{"package", "version", "name", "sha256", "path", "files"}] in series order;
                    path is the patch inside the image, files the site-packages paths it changes
    serve           {"env": {NAME: value}, "cache_dir": "/cache",
                     "modes": {mode: {"args": {server_arg: value}, "env": {...},
                                       "reasons": {server_arg: why the profile sets it},
                                       "requires_draft_model": bool,
                                       "reference": {"own": FIGURE | null, "replaced": FIGURE | null}}}}
                    args use ServerArgs names (tp_size, attention_backend, ...); true means a bare flag.
                    "own" is this row's pinned figure for the mode, "replaced" the replaced row's;
                    FIGURE is {"stack", "mode", "tok_s", "attention_backend", "model", "hardware",
                    "source", "note"} as bench/reference.toml records it
    bench           {"input_len", "output_len", "num_prompts", "regression_tolerance"}
    overrides       [{"package", "declared_by", "declared", "reason"}]
    jit_device_code {kernel family: reason} for families ("flashinfer") whose code for the target
                    is compiled on first start into the cache dir instead of shipping prebuilt
"""

from __future__ import annotations

import json
import os

DEFAULT_PATH = "/opt/builder/stack.json"
SCHEMA_VERSION = 2


def load(path: str | None = None) -> dict:
    """Read the stack description; BUILDER_STACK_JSON overrides the path (tests, bare hosts)."""
    path = path or os.environ.get("BUILDER_STACK_JSON", DEFAULT_PATH)
    with open(path, encoding="utf-8") as handle:
        info = json.load(handle)
    if info.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: unsupported stack.json schema {info.get('schema')!r}")
    return info


def server_arg_flags(args: dict) -> list[str]:
    """ServerArgs-named settings to `launch_server` flags: tp_size=8 -> --tp-size 8."""
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            flags.append(flag)
            flags.extend(str(item) for item in value)
        else:
            flags.extend([flag, str(value)])
    return flags
