"""Load, validate and expand matrix.toml into frozen stack rows.

Every problem is reported at once, one line each as `file:line: message`,
before anything is built. Axes expand a [[stack]] into one row per
combination of axis values, named `<stack>-<value>...`.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import compat, schema
from builder.errors import UserError
from builder.stack import Base, Bench, Override, Package, Serve, ServeMode, Stack
from builder.tomlpos import Positions

# Usable as a Docker tag and as a directory name.
_ROW_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
LOCAL_SUFFIX = "-local"
LOCAL_BASE_REPOSITORY = "localhost/builder-base"
PATCHES_ROOT = Path(__file__).resolve().parent.parent / "patches"


class MatrixError(UserError):
    """One or more problems in the matrix, each a `file:line: message` line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Matrix:
    path: Path
    stacks: tuple[Stack, ...]  # rows as configured (registry or local base)
    registry_stacks: tuple[Stack, ...]  # every row on its registry base
    local_stacks: tuple[Stack, ...]  # every row again, on the local base
    local_base: dict
    source_date_epoch: int

    def all_rows(self) -> tuple[Stack, ...]:
        return self.registry_stacks + self.local_stacks

    def stack(self, name: str) -> Stack:
        rows = {row.name: row for row in self.all_rows()}
        if name in rows:
            return rows[name]
        close = difflib.get_close_matches(name, list(rows), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(rows)})"
        raise UserError(f"unknown stack '{name}'{hint}")

    def select(self, names: list[str] | None, local_base: bool = False) -> tuple[Stack, ...]:
        """Rows named (all configured rows when none), moved onto the local base if asked."""
        rows = tuple(self.stack(n) for n in names) if names else self.stacks
        if local_base:
            rows = tuple(row if row.base.local else self.stack(row.name + LOCAL_SUFFIX) for row in rows)
        return rows


def load_matrix(path: str | Path, local_base: bool = False, patches_root: Path = PATCHES_ROOT) -> Matrix:
    """Read and validate `path`; with local_base every configured row uses the local base."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"{path}: cannot read the matrix: {error.strerror}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise MatrixError([f"{path}:{_syntax_error_position(error)}: TOML syntax error: {_syntax_error_message(error)}"]) from None
    loader = _Loader(path, Positions(text), document, patches_root)
    return loader.load(local_base)


def _syntax_error_position(error: tomllib.TOMLDecodeError) -> str:
    match = re.search(r"\(at line (\d+), column (\d+)\)", str(error))
    return f"{match.group(1)}:{match.group(2)}" if match else "1"


def _syntax_error_message(error: tomllib.TOMLDecodeError) -> str:
    return re.sub(r"\s*\(at line \d+, column \d+\)|\s*\(at end of document\)", "", str(error))


def _override(spec: dict, packages: list[Package]) -> Override:
    """An override row, with the requirement it overrides looked up in the compatibility data."""
    package, declared_by = canonicalize_name(spec["package"]), canonicalize_name(spec["declared_by"])
    declaring = next((p for p in packages if p.name == declared_by), None)
    declared = compat.declared_requirement(declared_by, declaring.parsed_version.public, package) if declaring else ""
    return Override(package, declared_by, declared, spec["reason"])


def _deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class _Loader:
    def __init__(self, path: Path, positions: Positions, document: dict, patches_root: Path):
        self.path = path
        self.positions = positions
        self.document = document
        self.patches_root = patches_root
        self.problems: list[tuple[int, str]] = []

    def problem(self, key_path, message: str) -> None:
        self.problems.append((self.positions.line(key_path) or 1, message))

    def fail_if_problems(self) -> None:
        if self.problems:
            ordered = sorted(dict.fromkeys(self.problems))
            raise MatrixError([f"{self.path}:{line}: {message}" for line, message in ordered])

    def load(self, local_base: bool) -> Matrix:
        for key_path, message in schema.check(self.document, schema.MATRIX):
            self.problem(key_path, message)
        self.fail_if_problems()
        if self.document["schema"] != 1:
            self.problem(("schema",), f"unsupported matrix schema {self.document['schema']} (this builder reads 1)")
        registry_rows, local_rows = [], []
        for index, raw in enumerate(self.document["stack"]):
            for row_data, axes in self._expand(index, raw):
                registry_rows.append(self._row(index, row_data, axes, local=False))
                local_rows.append(self._row(index, row_data, axes, local=True))
        self.fail_if_problems()
        self._check_names(registry_rows + local_rows)
        self._check_replaces(registry_rows + local_rows)
        for row in registry_rows + local_rows:
            for key_path, message in compat.check_stack(row, self.patches_root):
                self.problem(self._locate(row, key_path), f"{row.name}: {message}")
        self.fail_if_problems()
        default_source = self.document["defaults"].get("base_source", "registry")
        configured = [
            local if local_base or self._base_source(row, default_source) == "local" else row
            for row, local in zip(registry_rows, local_rows)
        ]
        return Matrix(self.path, tuple(configured), tuple(registry_rows), tuple(local_rows), self.document["local_base"],
                      self.document["defaults"]["source_date_epoch"])

    def _base_source(self, row: Stack, default: str) -> str:
        raw = self.document["stack"][self._stack_index(row)]
        merged = raw
        for axis, value in row.axes:
            merged = _deep_merge(merged, raw["axes"][axis][value])
        return merged.get("base_source", default)

    def _stack_index(self, row: Stack) -> int:
        return next(i for i, raw in enumerate(self.document["stack"]) if raw["name"] == row.family)

    def _expand(self, index: int, raw: dict):
        """Yield (merged stack table, ((axis, value), ...)) for each axis combination."""
        axes = raw.get("axes", {})
        base = {k: v for k, v in raw.items() if k != "axes"}
        for axis, values in axes.items():
            if not values:
                self.problem(("stack", index, "axes", axis), f"axis '{axis}' has no values")
        combos = itertools.product(*[[(axis, value) for value in values] for axis, values in axes.items()])
        for combo in combos:
            merged = base
            for axis, value in combo:
                merged = _deep_merge(merged, axes[axis][value])
            missing = [(p, m) for p, m in schema.check(merged, schema.Table(schema.STACK_FIELDS), ("stack", index))
                       if m.startswith("missing required key")]
            if missing:
                for key_path, message in missing:
                    self.problem(key_path, message + (f" (in the row for {', '.join(v for _, v in combo)})" if combo else ""))
                continue
            yield merged, tuple(combo)

    def _row(self, index: int, data: dict, axes: tuple, local: bool) -> Stack:
        defaults = self.document["defaults"]
        name = "-".join([data["name"], *(value for _, value in axes)]) + (LOCAL_SUFFIX if local else "")
        base = self._local_base() if local else self._registry_base(index, data["base"], axes)
        packages = []
        for package_name, spec in data["packages"].items():
            try:
                Version(spec["version"])
            except InvalidVersion:
                self.problem(self._axis_path(index, axes, ("packages", package_name, "version")),
                             f"{name}: '{spec['version']}' is not a valid version for {package_name}")
                spec = {**spec, "version": "0"}
            if spec.get("index") and spec.get("url"):
                self.problem(self._axis_path(index, axes, ("packages", package_name)),
                             f"{name}: {package_name} names both an index and a url; give one source")
            packages.append(Package(canonicalize_name(package_name), spec["version"], spec.get("index"), spec.get("url")))
        packages.sort(key=lambda p: p.name)
        overrides = tuple(_override(o, packages) for o in data.get("overrides", []))
        serve = data["serve"]
        modes = tuple(
            ServeMode(mode, dict(spec["args"]), dict(spec.get("env", {})),
                      spec.get("requires_draft_model", False), dict(spec.get("reasons", {})))
            for mode, spec in serve["modes"].items()
        )
        return Stack(
            name=name,
            family=data["name"],
            description=data.get("description", ""),
            axes=axes,
            cuda=data["cuda"],
            python=base.python,
            base=base,
            target_arch=tuple(data["target_arch"]),
            packages=tuple(packages),
            overrides=overrides,
            patched=tuple(canonicalize_name(p) for p in data.get("patched", [])),
            jit_device_code=dict(data.get("jit_device_code", {})),
            serve=Serve(serve["cache_dir"], dict(serve.get("env", {})), modes),
            bench=Bench(**data["bench"]),
            source_date_epoch=defaults["source_date_epoch"],
            repository=defaults["repository"],
            source_line=self.positions.line(("stack", index)) or 1,
            replaces=data["replaces"] + (LOCAL_SUFFIX if local else "") if data.get("replaces") else None,
        )

    def _registry_base(self, index: int, name: str, axes: tuple) -> Base:
        bases = self.document["bases"]
        if name not in bases:
            close = difflib.get_close_matches(name, list(bases), n=1)
            self.problem(self._axis_path(index, axes, ("base",)),
                         f"unknown base '{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            return Base(name, name, "", "0.0", "", (), "0.0", False)
        spec = bases[name]
        if spec["digest"] and not re.fullmatch(r"sha256:[0-9a-f]{64}", spec["digest"]):
            self.problem(("bases", name, "digest"), f"base {name}: digest must be 'sha256:' and 64 hex digits")
        return Base(name, spec["image"], spec["digest"], spec["python"], spec["venv_python"],
                    tuple(spec.get("system_packages", ())), spec["cuda"], False)

    def _local_base(self) -> Base:
        spec = self.document["local_base"]
        return Base(spec["name"], f"{LOCAL_BASE_REPOSITORY}:{spec['name']}", "", spec["python"],
                    spec["venv_python"], (), None, True)

    def _axis_path(self, index: int, axes: tuple, sub: tuple) -> tuple:
        """The key path that defined `sub` for this row: an axis table if it sets it, else the stack."""
        for axis, value in reversed(axes):
            candidate = ("stack", index, "axes", axis, value) + sub
            if self.positions.defines(candidate):
                return candidate
        return ("stack", index) + sub

    def _locate(self, row: Stack, sub: tuple) -> tuple:
        return self._axis_path(self._stack_index(row), row.axes, sub)

    def _check_replaces(self, rows: list[Stack]) -> None:
        names = {row.name for row in rows}
        for row in rows:
            if row.replaces and (row.replaces not in names or row.replaces == row.name):
                self.problem(self._locate(row, ("replaces",)),
                             f"{row.name}: replaces '{row.replaces}', which is not another row of the matrix")
        self.fail_if_problems()

    def _check_names(self, rows: list[Stack]) -> None:
        seen: set[str] = set()
        for row in rows:
            if not _ROW_NAME.match(row.name):
                self.problems.append((row.source_line, f"stack name '{row.name}' is not usable as a tag "
                                                       "(lowercase letters, digits, '.', '_', '-')"))
            if row.name in seen:
                self.problems.append((row.source_line, f"duplicate stack name '{row.name}'"))
            seen.add(row.name)
        self.fail_if_problems()

