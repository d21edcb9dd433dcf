"""The folders follow the data, and imports only run down: each folder of builder/ may import the folders
listed after it in FLOORS, never one before it, and no modules import each other in a circle. Every
module is parsed with `ast` (imports inside functions count too); the checkers run on made graphs first,
so a checker that cannot fail fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "builder"

# From the top down; one line each, the order docs/layout.md gives. A folder may import itself and
# anything below it. The shared helpers and runtime/ (stdlib only, runs in the image) are the ground.
FLOORS = (
    "cli", "status", "verify", "build_stack", "bump", "base", "smoke", "cache", "render", "publish", "lock",
    "engine", "config", "oci", "patches", "net", "escape", "errors", "files", "paths", "runtime",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The builder modules a file imports, by their full names (`from builder.x import y` names
    builder.x.y when that is a module, else builder.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("builder"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("builder"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return {name for name in found if name in known}


def house() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    known = set(files)
    return {name: imported_modules(path, known) - {name} for name, path in files.items()}


def folder(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for each import from a folder to one listed above it (package faces excepted: a folder's
    __init__ is its own)."""
    found = []
    for source, targets in graph.items():
        for target in targets:
            if folder(target) and folder(source) and FLOORS.index(folder(target)) < FLOORS.index(folder(source)):
                found.append(f"{source} -> {target}")
    return sorted(found)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_checkers_catch_what_they_look_for():
    made = {"builder.lock.a": {"builder.render.b"}, "builder.render.b": {"builder.lock.a"},
            "builder.cli.c": {"builder.lock.a"}}
    assert upward_imports(made) == ["builder.lock.a -> builder.render.b"]
    assert circles(made) == [["builder.lock.a", "builder.render.b"]]
    assert circles({"builder.a.x": {"builder.a.y"}, "builder.a.y": set()}) == []


def test_every_folder_of_builder_has_a_floor_and_says_its_job():
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    modules = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    assert folders | modules == set(FLOORS)
    for name in folders:
        docstring = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert docstring, f"builder/{name}/__init__.py says nothing of its job"


def test_imports_only_run_down_the_floors():
    assert upward_imports(house()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(house()) == []
