"""Find the shared objects the dynamic loader would load, by glibc's rules.

For a DT_NEEDED name, ld.so uses a library already loaded under that soname,
else searches: the DT_RPATH of the object and of the objects that loaded it
(only when the object has no DT_RUNPATH), LD_LIBRARY_PATH, the object's
DT_RUNPATH, /etc/ld.so.cache, and the default directories. `$ORIGIN` is the
directory of the object that holds the path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from builder.runtime.binaries import elf

DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                "/lib", "/usr/lib")
# The NVIDIA container runtime mounts these from the host driver; an image
# must not ship them, so outside a GPU container they are legitimately absent.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})


@dataclass(frozen=True)
class ObjectInfo:
    path: str
    machine: int
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    version_needs: dict[str, set[str]]


def ld_cache() -> dict[str, str]:
    """{soname: path} from `ldconfig -p` for this machine's ABI; empty without ldconfig."""
    ldconfig = shutil.which("ldconfig") or next(
        (path for path in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(path)), None)
    if ldconfig is None:
        return {}
    done = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False)
    cache: dict[str, str] = {}
    for line in done.stdout.splitlines()[1:]:
        name, _, rest = line.strip().partition(" (")
        flags, _, path = rest.partition(") => ")
        if path and "x86-64" in flags:
            cache.setdefault(name, path)
    return cache


def expand(directory: str, origin: str) -> str:
    for token in ("${ORIGIN}", "$ORIGIN"):
        directory = directory.replace(token, origin)
    return os.path.normpath(directory)


class Loader:
    """Resolves sonames like ld.so for one process; `preloaded` are sonames already loaded."""

    def __init__(self, preloaded: dict[str, str] | None = None,
                 ld_library_path: str | None = None, cache: dict[str, str] | None = None):
        self.preloaded = dict(preloaded or {})
        library_path = os.environ.get("LD_LIBRARY_PATH", "") if ld_library_path is None \
            else ld_library_path
        self.ld_library_path = [part for part in library_path.split(":") if part]
        self.cache = ld_cache() if cache is None else cache
        self._infos: dict[str, ObjectInfo | None] = {}

    def info(self, path: str) -> ObjectInfo | None:
        """The dynamic-linking facts of an ELF file; None when it is not a readable ELF."""
        path = os.path.realpath(path)
        if path not in self._infos:
            try:
                with elf.ElfFile(path) as obj:
                    self._infos[path] = ObjectInfo(
                        path, obj.machine, obj.soname, tuple(obj.needed), tuple(obj.rpath),
                        tuple(obj.runpath), obj.version_needs)
            except (OSError, elf.ElfError):
                self._infos[path] = None
        return self._infos[path]

    def resolve(self, name: str, requester: ObjectInfo,
                inherited_rpath: tuple[tuple[str, str], ...] = ()) -> str | None:
        """Path that `name`, needed by `requester`, loads; None when the loader would fail.

        inherited_rpath: (rpath entry, origin) of the objects that loaded the requester.
        """
        if "/" in name:
            return self._accept(name, requester)
        if name in self.preloaded:
            return self.preloaded[name]
        origin = os.path.dirname(requester.path)
        directories: list[str] = []
        if not requester.runpath:
            directories += [expand(entry, origin) for entry in requester.rpath]
            directories += [expand(entry, entry_origin) for entry, entry_origin in inherited_rpath]
        directories += self.ld_library_path
        directories += [expand(entry, origin) for entry in requester.runpath]
        for directory in directories:
            found = self._accept(os.path.join(directory, name), requester)
            if found:
                return found
        cached = self.cache.get(name)
        if cached and self._accept(cached, requester):
            return self._accept(cached, requester)
        for directory in DEFAULT_DIRS:
            found = self._accept(os.path.join(directory, name), requester)
            if found:
                return found
        return None

    def _accept(self, path: str, requester: ObjectInfo) -> str | None:
        if not os.path.isfile(path):
            return None
        candidate = self.info(path)
        if candidate is None or candidate.machine != requester.machine:
            return None  # ld.so skips files of another architecture and keeps searching
        return candidate.path

    def closure(self, path: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """Load `path` and everything it needs, breadth first like ld.so.

        Returns ({soname or path: resolved path} in load order, [(requester, missing name)]).
        """
        root = self.info(path)
        if root is None:
            raise elf.ElfError(f"{path}: not a readable ELF file")
        loaded: dict[str, str] = {root.soname or root.path: root.path}
        missing: list[tuple[str, str]] = []
        queue = [(root, ())]
        while queue:
            obj, inherited = queue.pop(0)
            chain = inherited if obj.runpath else inherited + tuple(
                (entry, os.path.dirname(obj.path)) for entry in obj.rpath)
            for name in obj.needed:
                if name in loaded:
                    continue
                found = self.resolve(name, obj, inherited)
                if found is None:
                    missing.append((obj.path, name))
                    loaded[name] = ""
                    continue
                loaded[name] = found
                dependency = self.info(found)
                if dependency is not None:
                    queue.append((dependency, chain))
        return {name: where for name, where in loaded.items() if where}, missing
