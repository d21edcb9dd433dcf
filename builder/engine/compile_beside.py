"""The byte-compile step run beside the step before it, and the proof that its layer still holds.

The template puts the byte-compile step (`install_wheels.py compile SITE_PACKAGES`, the builder's own
tool) right after the FlashInfer bake, which writes no bytecode. The bake leaves a core idle for about a
quarter of its minutes (ninja's last jobs run one at a time); the compile is over a minute of CPU. So the
write-once build starts the compile together with the bake, on a second root stacked from the same layers,
in the background (the least CPU weight for its container's cgroup, nice 19 inside): it takes what the
bake leaves. Its layer is used only where the bake's layer
cannot have changed it (`difference`): nothing the bake wrote lies where the compile reads, and each
directory both layers hold (a parent such as /opt) has the same header in both. Otherwise the compile runs
again on top of the bake, as the Dockerfile orders it.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.oci import dockerfile_plan
from builder.paths import TOOLS_DIR

INSTALL_TOOL = f"{TOOLS_DIR}/install_wheels.py"
# What any Python reads besides its arguments: the interpreter, its standard library and the shared
# libraries (merged /usr or not), its configuration, and the user's site directory of any home.
_SYSTEM_READS = ("bin", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "root/.local", "home")
# Variables that would send the interpreter or the loader elsewhere: with one set, nothing is run beside.
_STEERING = ("PYTHON", "LD_")


@dataclass(frozen=True)
class CompileReads:
    roots: tuple[str, ...]  # relative paths the step may read anything below
    script_dir: str  # the tool's directory, first on the module path

    def covers(self, path: str) -> bool:
        """Whether the compile may read `path` (relative to the image's root)."""
        if any(path == root or path.startswith(root + "/") for root in self.roots):
            return True
        if path.startswith(self.script_dir + "/"):
            # A name there could be imported in place of a module the tool imports.
            first = path[len(self.script_dir) + 1:].split("/")[0]
            return first.split(".")[0].isidentifier()
        return False


def compile_reads(step: dockerfile_plan.Step, env: Mapping[str, str]) -> CompileReads | None:
    """What the template's byte-compile step reads, or None for any other step (or one whose
    environment could steer its interpreter)."""
    argv = step.argv
    if (step.keyword != "RUN" or step.mounts or len(argv) != 7 or argv[:2] != ("/usr/bin/env", "PYTHONHASHSEED=0")
            or argv[3:6] != ("-B", INSTALL_TOOL, "compile") or any(name.startswith(_STEERING) for name in env)):
        return None
    python, site_packages = argv[2], argv[6]
    paths = (python, site_packages, INSTALL_TOOL)
    if not all(path.startswith("/") and posixpath.normpath(path) == path for path in paths):
        return None
    venv = posixpath.dirname(posixpath.dirname(python))
    return CompileReads(roots=(*_SYSTEM_READS, *(path.lstrip("/") for path in (venv, site_packages, INSTALL_TOOL))),
                        script_dir=posixpath.dirname(INSTALL_TOOL).lstrip("/"))


def _attributes(member: tarfile.TarInfo) -> tuple:
    return (member.type, member.mode, member.uid, member.gid, member.uname, member.gname, member.mtime,
            member.linkname, sorted(member.pax_headers.items()))


def _name(member: tarfile.TarInfo) -> str:
    return member.name.removeprefix("./").rstrip("/")


def difference(reads: CompileReads, between: Path, compiled: Path, compiled_paths: Sequence[str]) -> str | None:
    """Why the compile's layer `compiled` (holding `compiled_paths`), written on the layers without the
    layer tar `between`, may not be the one it writes on top of it; None when it is that layer."""
    directories: dict[str, tuple] = {}
    with tarfile.open(between, mode="r:") as tar:
        for member in tar:
            path = _name(member)
            if path and reads.covers(path):
                return f"the step before it wrote /{path}, which the compile reads"
            if member.isdir():
                directories[path] = _attributes(member)
    shared = directories.keys() & set(compiled_paths)
    if not shared:
        return None
    with tarfile.open(compiled, mode="r:") as tar:
        for member in tar:  # parents come first: the shared directories are read early
            path = _name(member)
            if path in shared:
                if _attributes(member) != directories[path]:
                    return f"/{path} differs between the two layers"
                shared.discard(path)
                if not shared:
                    return None
    return None
