"""One door to container engines: only builder/engine/ names a concrete engine. Every other module is handed
an engine (the CLI makes it with builder.engine's factories) and asks it for what it needs, never which
engine it is. Each module is parsed with `ast`; the rules are checked on made sources first, so a checker
that cannot fail fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from builder.engine import ENGINE_NAMES

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "builder"
ENGINE_PACKAGE = PACKAGE / "engine"
CLI_PACKAGE = PACKAGE / "cli"
CONCRETE_MODULES = {"builder.engine.buildah", "builder.engine.docker"}
CONCRETE_CLASSES = {"BuildahEngine", "DockerEngine"}
FACTORIES = {"get_engine", "storage_engine"}


def _is_engine_name(node: ast.AST) -> bool:
    """`engine.name`, `self.engine.name`, `loader.name`...: the name attribute of something called an engine
    (or a loader, as `--load` calls the engine that delivers into Docker)."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    label = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
    return "engine" in label.lower() or "loader" in label.lower()


def _names_an_engine(node: ast.AST) -> bool:
    """A string constant that is an engine's name, alone or inside a tuple, list or set."""
    if isinstance(node, ast.Constant):
        return node.value in ENGINE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_an_engine(element) for element in node.elts)
    return False


def problems(source: str, may_make_engines: bool) -> list[str]:
    """Each way `source` opens a second door to an engine, as 'line: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            for module in sorted(modules & CONCRETE_MODULES):
                found.append(f"{line}: imports a concrete engine module ({module})")
            if not may_make_engines and node.module == "builder.engine" and FACTORIES & {a.name for a in node.names}:
                found.append(f"{line}: imports an engine factory (only the CLI makes engines)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in CONCRETE_MODULES:
                    found.append(f"{line}: imports a concrete engine module ({alias.name})")
        elif isinstance(node, ast.Name) and node.id in CONCRETE_CLASSES:
            found.append(f"{line}: names {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in CONCRETE_CLASSES:
            found.append(f"{line}: names {node.attr}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_engine_name(o) or _names_an_engine(o) for o in operands):
                found.append(f"{line}: compares with an engine's name")
        elif isinstance(node, ast.Match) and _is_engine_name(node.subject):
            found.append(f"{line}: matches on an engine's name")
        elif isinstance(node, ast.Call) and not may_make_engines:
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else called.id if isinstance(called, ast.Name) else ""
            if name in FACTORIES:
                found.append(f"{line}: makes an engine with {name}() (only the CLI makes engines)")
    return sorted(set(found), key=lambda text: int(text.split(":")[0]))


def modules_outside_the_engine() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if ENGINE_PACKAGE not in path.parents)


@pytest.mark.parametrize("source, may_make_engines, expected", [
    # The forms the old code had, each caught.
    ('if engine.name == "buildah":\n    pass\n', False, ["1: compares with an engine's name"]),
    ('if engine.name != "buildah":\n    pass\n', False, ["1: compares with an engine's name"]),
    ("from builder.engine.buildah import BuildahEngine\n", False,
     ["1: imports a concrete engine module (builder.engine.buildah)"]),
    ("def f():\n    from builder.engine.buildah import BuildahEngine\n    return BuildahEngine(export_to_docker=False)\n",
     False, ["2: imports a concrete engine module (builder.engine.buildah)", "3: names BuildahEngine"]),
    ("from builder.engine.buildah import host_canonical_index\n", False,
     ["1: imports a concrete engine module (builder.engine.buildah)"]),
    ('from builder.engine import get_engine\nengine = get_engine("buildah")\n', False,
     ["1: imports an engine factory (only the CLI makes engines)", "2: makes an engine with get_engine() "
      "(only the CLI makes engines)"]),
    # Other spellings of the same.
    ('x = self.engine.name in ("docker", "podman")\n', False, ["1: compares with an engine's name"]),
    ('x = kind == "docker"\n', False, ["1: compares with an engine's name"]),
    ("match loader.name:\n    case _:\n        pass\n", False, ["1: matches on an engine's name"]),
    ("import builder.engine.docker\n", False, ["1: imports a concrete engine module (builder.engine.docker)"]),
    ("from builder.engine import docker\n", False, ["1: imports a concrete engine module (builder.engine.docker)"]),
    ("x = builder.engine.docker.DockerEngine()\n", False, ["1: names DockerEngine"]),
    # What stays allowed: the CLI makes engines; an engine's name in a message; other names compared.
    ("from builder.engine import get_engine, storage_engine\nengine = get_engine(args.engine)\n", True, []),
    ('message = f"not in {engine.name}"\n', False, []),
    ("found = stack.name == wanted\n", False, []),
    ("with engine.container_api() as api:\n    pass\n", False, []),
])
def test_the_rules_catch_each_second_door(source, may_make_engines, expected):
    assert problems(source, may_make_engines) == expected


def test_nothing_outside_the_engine_package_opens_a_second_door():
    modules = modules_outside_the_engine()
    assert len(modules) > 50 and PACKAGE / "build_stack" / "build.py" in modules  # the walk reached the tree
    found = [f"{path.relative_to(REPO)}:{problem}"
             for path in modules
             for problem in problems(path.read_text(encoding="utf-8"), CLI_PACKAGE in path.parents)]
    assert found == []
