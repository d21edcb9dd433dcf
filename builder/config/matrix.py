"""Load, validate and expand matrix.toml into frozen stack rows.

Every problem is reported at once, one line each as `file:line: message`,
before anything is built. Axes expand a [[stack]] into one row per
combination of axis values, named `<stack>-<value>...`.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.config import compat, grammar, schema
from builder.config.stack import AptSpec, Base, Bench, Override, Package, Serve, ServeMode, Stack
from builder.config.toml_positions import Positions
from builder.errors import UserError, one_line
from builder.paths import Project, local_base_tag

# Usable as a Docker tag and as a directory name.
_ROW_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
_NAME_PART = re.compile(r"^[a-z0-9._-]+$")
LOCAL_SUFFIX = "-local"
# CUDA "13.0.1" or "12.8"; an interpreter "3.12".
# A serve mode names a compose service and profile (images/<stack>/compose.yaml) and a bench report file.
_MODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CUDA = re.compile(r"^\d{1,2}\.\d{1,2}(\.\d{1,3})?$")
_PYTHON = re.compile(r"^3\.\d{1,2}$")
# SOURCE_DATE_EPOCH stamps files, configs and labels: from 1970 to the last second of year 9999,
# the range every timestamp format on the way (tar, OCI config, ISO 8601) can hold.
EPOCH_MAX = 253402300799


class MatrixError(UserError):
    """One or more problems in the matrix, each a `file:line: message` line."""

    def __init__(self, problems: list[str]):
        self.problems = [one_line(problem) for problem in problems]
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Matrix:
    path: Path
    stacks: tuple[Stack, ...]  # rows as configured (registry or local base)
    registry_stacks: tuple[Stack, ...]  # every row on its registry base
    local_stacks: tuple[Stack, ...]  # every row again, on the local base
    local_base: dict
    source_date_epoch: int

    @property
    def project(self) -> Project:
        """The directory holding the matrix: its lock, renders, patches, templates and reports."""
        return Project.of_matrix(self.path)

    @property
    def root(self) -> Path:
        return self.project.root

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


def _apt_spec(spec: dict, suite: str, packages: tuple[str, ...], scope: str) -> AptSpec:
    return AptSpec(spec.get("distribution", "debian"), suite, tuple(sorted(set(packages))), scope,
                   sources=tuple(spec.get("sources", ())), keyring=spec.get("keyring"), snapshot=spec.get("snapshot"))


def load_matrix(path: str | Path, local_base: bool = False, patches_root: Path | None = None) -> Matrix:
    """Read and validate `path`; with local_base every configured row uses the local base. Patch
    series are looked up in the matrix's project unless `patches_root` names another directory."""
    path = Path(path)
    patches_root = patches_root or Project.of_matrix(path).patches
    text = _read_text(path)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise MatrixError([f"{path}:{_syntax_error_position(error)}: TOML syntax error: {_syntax_error_message(error)}"]) from None
    loader = _Loader(path, Positions(text), document, patches_root)
    return loader.load(local_base)


def _read_text(path: Path) -> str:
    """The matrix as text; a FIFO, a device or a folder is refused before it is opened (reading a FIFO
    blocks until something writes to it)."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{path}: cannot read the matrix: not a regular file")
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"{path}: cannot read the matrix: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise MatrixError([f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[error.start]:02x}); "
                           "TOML files are UTF-8"]) from None


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
        # (line, message) -> the rows it was found in (none for a problem outside any row): a problem
        # an axis does not change is found in every row it expands to, and reported once.
        self.problems: dict[tuple[int, str], list[str]] = {}
        self.family_rows: dict[str, list[str]] = {}
        self.bad_names: set[str] = set()

    def problem(self, key_path, message: str, row: str | None = None) -> None:
        rows = self.problems.setdefault((self.positions.line(key_path) or 1, message), [])
        if row is not None and row not in rows:
            rows.append(row)

    def fail_if_problems(self) -> None:
        if self.problems:
            raise MatrixError([f"{self.path}:{line}: {self._rows_label(rows)}{message}"
                               for (line, message), rows in sorted(self.problems.items())])

    def _rows_label(self, rows: list[str]) -> str:
        """'' for no row; the [[stack]] name when every row it expands to has the problem; a row
        on both bases is named once, as on its registry base."""
        if not rows:
            return ""
        for family, members in self.family_rows.items():
            if sorted(rows) == sorted(members):
                return f"{family}: "
        shown = [row for row in rows if not (row.endswith(LOCAL_SUFFIX) and row.removesuffix(LOCAL_SUFFIX) in rows)]
        return ", ".join(shown) + ": "

    def load(self, local_base: bool) -> Matrix:
        for key_path, message in schema.check(self.document, schema.MATRIX):
            self.problem(key_path, message)
        self.fail_if_problems()
        for key_path, message in grammar.check(self.document):
            self.problem(key_path, message)
        self.fail_if_problems()
        if self.document["schema"] != 1:
            self.problem(("schema",), f"unsupported matrix schema {self.document['schema']} (this builder reads 1)")
        self._check_defaults()
        registry_rows, local_rows, indices = [], [], []
        for index, raw in enumerate(self.document["stack"]):
            for row_data, axes in self._expand(index, raw):
                registry_rows.append(self._row(index, row_data, axes, local=False))
                local_rows.append(self._row(index, row_data, axes, local=True))
                indices.append(index)
        self.fail_if_problems()
        self._check_names(list(zip(indices + indices, registry_rows + local_rows)))
        self._check_replaces(registry_rows + local_rows)
        for row in registry_rows + local_rows:
            for key_path, message in compat.check_stack(row, self.patches_root):
                self.problem(self._locate(row, key_path), message, row.name)
        self.fail_if_problems()
        default_source = self.document["defaults"].get("base_source", "registry")
        configured = [
            local if local_base or self._base_source(row, default_source) == "local" else row
            for row, local in zip(registry_rows, local_rows)
        ]
        return Matrix(self.path, tuple(configured), tuple(registry_rows), tuple(local_rows), self.document["local_base"],
                      self.document["defaults"]["source_date_epoch"])

    def _check_defaults(self) -> None:
        epoch = self.document["defaults"]["source_date_epoch"]
        if not 0 <= epoch <= EPOCH_MAX:
            self.problem(("defaults", "source_date_epoch"),
                         f"source_date_epoch {epoch} is not a time from 1970 to 9999 (0 to {EPOCH_MAX} seconds)")
        local = self.document["local_base"]
        if not _PYTHON.fullmatch(local["python"]):
            self.problem(("local_base", "python"), f"local_base python '{local['python']}' must look like '3.11'")

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
        self.family_rows.setdefault(data["name"], []).append(name)
        base = self._local_base() if local else self._registry_base(index, data["base"], axes)
        cuda = data["cuda"]
        if not _CUDA.fullmatch(cuda):
            self.problem(self._axis_path(index, axes, ("cuda",)), f"cuda '{cuda}' must look like '13.0.1'", name)
            cuda = "0.0"
        packages = [self._package(index, axes, name, key, spec)
                    for key, spec in self._distinct_pins(index, axes, name, data["packages"]).items()]
        packages.sort(key=lambda p: p.name)
        overrides = tuple(_override(o, packages) for o in data.get("overrides", []))
        serve = data["serve"]
        for mode in serve["modes"]:
            if not _MODE_NAME.fullmatch(mode):
                self.problem(self._axis_path(index, axes, ("serve", "modes", mode)),
                             f"serve mode '{mode}' is not usable as a compose service name "
                             "(a letter or digit, then letters, digits, '.', '_', '-')", name)
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
            cuda=cuda,
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
            source_url=defaults.get("source_url", ""),
            source_line=self.positions.line(("stack", index)) or 1,
            replaces=data["replaces"] + (LOCAL_SUFFIX if local else "") if data.get("replaces") else None,
        )

    def _distinct_pins(self, index: int, axes: tuple, row: str, pins: dict) -> dict:
        """The pins, less a second spelling of a distribution already pinned (a problem)."""
        kept: dict[str, str] = {}  # canonical name -> key as first written
        for key in pins:
            first = kept.setdefault(canonicalize_name(key), key)
            if first != key:
                self.problem(self._axis_path(index, axes, ("packages", key)),
                             f"{first} and {key} name the same distribution ({canonicalize_name(key)}); "
                             "pin it once", row)
        return {key: pins[key] for key in kept.values()}

    def _package(self, index: int, axes: tuple, row: str, key: str, spec: dict) -> Package:
        """One pin; a problem for an invalid version, or a url that names no wheel or another wheel."""
        where = self._axis_path(index, axes, ("packages", key))
        name = canonicalize_name(key)
        version = spec["version"]
        try:
            Version(version)
        except InvalidVersion:
            self.problem(self._axis_path(index, axes, ("packages", key, "version")),
                         f"'{version}' is not a valid version for {key}", row)
            version = "0"
        if spec.get("index") and spec.get("url"):
            self.problem(where, f"{key} names both an index and a url; give one source", row)
        if spec.get("url"):
            self._check_wheel_url(where, row, name, version, spec["url"])
        return Package(name, version, spec.get("index"), spec.get("url"))

    def _check_wheel_url(self, where: tuple, row: str, name: str, version: str, url: str) -> None:
        filename = url.rsplit("/", 1)[-1]
        try:
            wheel_name, wheel_version, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            self.problem(where, f"{name}: url must end in a wheel file name "
                                f"(NAME-VERSION-PYTHON-ABI-PLATFORM.whl), not '{filename}'", row)
            return
        if wheel_name != name or (version != "0" and wheel_version != Version(version)):
            self.problem(where, f"{name} {version}: its url is the wheel of {wheel_name} {wheel_version}", row)

    def _registry_base(self, index: int, name: str, axes: tuple) -> Base:
        bases = self.document["bases"]
        if name not in bases:
            close = difflib.get_close_matches(name, list(bases), n=1)
            self.problem(self._axis_path(index, axes, ("base",)),
                         f"unknown base '{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            return Base(name, name, "0.0", "", (), "0.0", False)
        spec = bases[name]
        for key, pattern, example in (("cuda", _CUDA, "13.0.1"), ("python", _PYTHON, "3.12")):
            if not pattern.fullmatch(spec[key]):
                self.problem(("bases", name, key), f"base {name}: {key} '{spec[key]}' must look like '{example}'")
        packages = tuple(spec.get("system_packages", ()))
        apt = None
        if packages:
            missing = [key for key in ("distribution", "suite") if key not in spec]
            if missing:
                self.problem(("bases", name), f"base {name}: system_packages need the archive's "
                                              f"{' and '.join(missing)}")
                return Base(name, spec["image"], spec["python"], spec["venv_python"], packages, spec["cuda"], False)
            apt = _apt_spec(spec, spec["suite"], packages, "added")
        return Base(name, spec["image"], spec["python"], spec["venv_python"], packages, spec["cuda"], False, apt)

    def _local_base(self) -> Base:
        spec = self.document["local_base"]
        return Base(spec["name"], local_base_tag(spec["name"]), spec["python"], spec["venv_python"], (), None, True,
                    _apt_spec(spec, spec["suite"], tuple(spec["packages"]), "root"))

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
                             f"replaces '{row.replaces}', which is not another row of the matrix", row.name)
        self.fail_if_problems()

    def _check_names(self, rows: list[tuple[int, Stack]]) -> None:
        """Row names usable as tags, each once; a bad one points at the axis value that made it."""
        seen: set[str] = set()
        for index, row in rows:
            if row.base.local and row.name.removesuffix(LOCAL_SUFFIX) in self.bad_names:
                continue  # the same name on the registry base is reported already
            if not _ROW_NAME.fullmatch(row.name):
                self.bad_names.add(row.name)
                bad_axes = [("stack", index, "axes", axis, value) for axis, value in row.axes
                            if not _NAME_PART.fullmatch(value)]
                self.problem(bad_axes[0] if bad_axes else ("stack", index, "name"),
                             f"stack name '{row.name}' is not usable as a tag "
                             "(at most 100 of: lowercase letters, digits, '.', '_', '-')")
            if row.name in seen:
                self.bad_names.add(row.name)
                self.problem(("stack", index, "name"), f"duplicate stack name '{row.name}'")
            seen.add(row.name)
        self.fail_if_problems()

