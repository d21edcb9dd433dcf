"""Carries out a wheel plan inside the image: the files `builder build` planned from one group's locked
wheels (builder/oci/wheel_layer.py), each taken from its wheel's zip member or from the plan itself,
with the planned mode. The builder writes the same files as the layer's tar without running this; it is
how a plain engine build of the rendered Dockerfile gets them (docs/write-once.md). The standard library
only: the virtual environment has no pip.

    python -I -B install_wheels.py install PLAN WHEEL_DIR [ROOT]
    python -I -B install_wheels.py compile SITE_PACKAGES

`compile` byte-compiles every module under SITE_PACKAGES, as pip does after an install (a file that does
not compile is skipped, as pip skips it), in _SHARES fresh interpreters at once: the modules in
compileall's order are dealt to them in turn, and each compiles its share in that order. marshal's
output depends on what else the process holds, so which process compiles a module, and what it
compiled before, must be the same on every build: the shares are fixed, not the host's core count.
"""

from __future__ import annotations

import base64
import compileall
import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
import zipfile

_FORMAT = 1
_MODES = (0o644, 0o755)
_SHARES = 4  # the .pyc files' bytes depend on it (see above)


def _fail(message: str) -> None:
    print(f"install_wheels: {message}", file=sys.stderr)
    raise SystemExit(1)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _safe(path: str) -> bool:
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


def _checked(plan_path: str) -> dict:
    """The plan, refused in one line unless every entry is one this tool writes."""
    try:
        with open(plan_path, "rb") as handle:
            plan = json.load(handle)
        if plan.get("format") != _FORMAT:
            _fail(f"{plan_path}: plan format {plan.get('format')!r}, this tool reads {_FORMAT}")
        wheels = len(plan["wheels"])
        for wheel in plan["wheels"]:
            if "/" in wheel["file"] or not _safe(wheel["file"]):
                _fail(f"{plan_path}: bad wheel name {wheel['file']!r}")
        for entry in plan["files"]:
            bad = not _safe(entry["path"]) or entry["mode"] not in _MODES or \
                ("data" not in entry and not (0 <= entry["wheel"] < wheels and isinstance(entry["member"], str)))
            if bad:
                _fail(f"{plan_path}: bad entry {entry['path']!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        _fail(f"{plan_path}: not a wheel plan: {error!r}")
    return plan


def install(plan_path: str, wheel_dir: str, root: str = "/") -> None:
    """Every file of the plan under `root` (the image's root; another directory in a test)."""
    plan = _checked(plan_path)
    archives = []
    for wheel in plan["wheels"]:
        path = os.path.join(wheel_dir, wheel["file"])
        if _sha256(path) != wheel["sha256"]:
            _fail(f"{wheel['file']}: not the locked file (sha256 differs from the plan's)")
        archives.append(zipfile.ZipFile(path))
    for entry in plan["files"]:
        target = os.path.join(root, entry["path"])
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "wb") as out:
            if "data" in entry:
                out.write(base64.b64decode(entry["data"], validate=True))
            else:
                with archives[entry["wheel"]].open(entry["member"]) as member:
                    shutil.copyfileobj(member, out, 1 << 20)
        os.chmod(target, entry["mode"])


def _modules(directory: str) -> list[str]:
    """The modules compileall.compile_dir compiles, in its order: names sorted, __pycache__ and linked
    directories not entered."""
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name == "__pycache__":
            continue
        if not os.path.isdir(path):
            if name.endswith(".py"):
                found.append(path)
        elif not os.path.islink(path):
            found.extend(_modules(path))
    return found


def compile_modules(site_packages: str) -> None:
    """Every module under `site_packages`, dealt to _SHARES interpreters (see above)."""
    modules = _modules(site_packages)
    children = []
    for share in range(_SHARES):
        child = subprocess.Popen([sys.executable, "-B", os.path.abspath(__file__), "compile-share"],
                                 stdin=subprocess.PIPE)
        with child.stdin:  # the child reads its whole share before it compiles
            child.stdin.write("\0".join(modules[share::_SHARES]).encode("utf-8", "surrogateescape"))
        children.append(child)
    failed = sum(child.wait() != 0 for child in children)
    if failed:
        _fail(f"compile: {failed} of {_SHARES} shares failed")


def compile_share() -> None:
    """The modules named on stdin (NUL-separated), in that order, in this process."""
    data = sys.stdin.buffer.read()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a module's SyntaxWarnings, silenced as pip silences them
        for module in data.decode("utf-8", "surrogateescape").split("\0") if data else ():
            compileall.compile_file(module, quiet=2)


def main(argv: list[str]) -> None:
    if len(argv) in (3, 4) and argv[0] == "install":
        install(*argv[1:])
    elif len(argv) == 2 and argv[0] == "compile":
        compile_modules(argv[1])
    elif argv == ["compile-share"]:
        compile_share()
    else:
        _fail("usage: install_wheels.py install PLAN WHEEL_DIR [ROOT] | compile SITE_PACKAGES")


if __name__ == "__main__":
    main(sys.argv[1:])
