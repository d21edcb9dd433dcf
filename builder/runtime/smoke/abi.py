"""abi: the compiled parts of the stack fit together and fit the image.

- abi.needed-libs.<dist>: every DT_NEEDED of every ELF .so resolves (RPATH/RUNPATH
  with $ORIGIN, libraries torch and tvm-ffi have already loaded, ld.so.cache,
  default directories); the driver's own libraries are allowed to be absent;
- abi.symbol-versions.<dist>: every symbol version an ELF needs (GLIBC_2.x,
  GLIBCXX_3.4.x, CXXABI_x, ...) is defined by the library that provides it;
- abi.undefined-symbols.<dist>: every non-weak undefined symbol of an extension
  is defined in the process it loads into (what `undefined symbol:` reports);
- abi.cxx11: torch._C._GLIBCXX_USE_CXX11_ABI agrees with the std::string
  mangling the extensions use (`std::__cxx11::` or the old `Ss`).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

from builder.runtime.binaries import elf
from builder.runtime.binaries import loader as library_loader
from builder.runtime.smoke import report
from builder.runtime.smoke.env import Environment, normalize, run_python

# Objects loaded before any extension: `import torch` loads _C and
# libtorch_global_deps (RTLD_GLOBAL); tvm-ffi (flashinfer's and SGLang's JIT
# kernel ABI) loads libtvm_ffi.so before their modules.
PRELOADED_OBJECTS = (
    ("torch", ("torch/_C.", "torch/lib/libtorch_global_deps.so")),
    ("apache-tvm-ffi", ("tvm_ffi/lib/libtvm_ffi.so",)),
)
PRELOADED_MODULES = ("torch", "tvm_ffi")
# Without a GPU the driver's libraries are absent, so its API (cuXxx, nvmlXxx:
# the driver's naming, kept strictly) cannot be looked up; those names are
# left to the gpu checks, every other undefined symbol is still checked.
_DRIVER_SYMBOL = re.compile(r"^(cu|nvml)[A-Z]")
_SHOWN = 5

_LIST_MAPS = textwrap.dedent("""
    import importlib, sys
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    maps = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) >= 6}
    print("\\n".join(sorted(path for path in maps if ".so" in path.rsplit("/", 1)[-1])))
""")


def mapped_after_import(modules: tuple[str, ...]) -> list[str]:
    """Shared objects mapped in a child interpreter after importing `modules` (best effort)."""
    child = run_python(["-c", _LIST_MAPS, *modules])
    if not child.ok:
        return []
    return [line for line in child.stdout.splitlines() if line.startswith("/")]


def extension_distributions(env: Environment) -> tuple[str, ...]:
    """Distributions whose extensions are loaded into a process that has already imported torch."""
    return env.kernel_distribution(), "flashinfer-python", "flashinfer-jit-cache"


def library_distributions(env: Environment) -> tuple[str, ...]:
    """Distributions whose shared objects are checked."""
    return ("torch", *extension_distributions(env))


def run(env: Environment) -> list[report.Result]:
    scan = _Scan(env)
    results: list[report.Result] = []
    for distribution in library_distributions(env):
        results.extend(scan.distribution_results(distribution))
    results.append(scan.cxx11())
    return results


def shared_objects(env: Environment, distribution: str) -> list[str]:
    return [str(path) for path in env.distribution_files(distribution)
            if (path.name.endswith(".so") or ".so." in path.name) and elf.is_elf(str(path))]


class _Scan:
    def __init__(self, env: Environment):
        self.env = env
        self.loader = library_loader.Loader()
        self.global_scope: dict[str, str] = {}  # soname -> path, loaded before extensions
        self._defined: dict[str, set[str]] = {}
        self._version_defs: dict[str, set[str]] = {}
        self._preload()

    def _preload(self) -> None:
        """What a process has loaded before any extension: read from a real one where possible.

        A child imports torch (and tvm_ffi) and lists its memory maps, which
        catches what torch loads with ctypes (nvrtc, cuDNN, ...); the static
        closure of their root objects covers a torch that cannot be imported.
        """
        roots = [os.path.realpath(sys.executable)]
        for distribution, prefixes in PRELOADED_OBJECTS:
            for path in shared_objects(self.env, distribution):
                if any(_relative(path, self.env).startswith(prefix) for prefix in prefixes):
                    roots.append(path)
        for root in roots:
            loaded, _ = self.loader.closure(root)
            self.global_scope.update(loaded)
        for path in mapped_after_import(PRELOADED_MODULES):
            info = self.loader.info(path)
            if info is not None:
                self.global_scope.setdefault(info.soname or os.path.basename(path), info.path)
        self.loader.preloaded.update(self.global_scope)

    def distribution_results(self, distribution: str) -> list[report.Result]:
        name = normalize(distribution)
        checks = [f"abi.needed-libs.{name}", f"abi.symbol-versions.{name}"]
        if distribution in extension_distributions(self.env):
            checks.append(f"abi.undefined-symbols.{name}")
        if not self.env.in_stack(distribution):
            return [report.skipped(check, f"{distribution} is not part of this stack")
                    for check in checks]
        objects = shared_objects(self.env, distribution)
        if not objects:
            return [report.skipped(check, f"{distribution} installs no ELF shared objects")
                    for check in checks]
        results = [self._needed_libs(checks[0], objects), self._symbol_versions(checks[1], objects)]
        if len(checks) == 3:
            results.append(self._undefined_symbols(checks[2], objects))
        return results

    # -- needed libraries ----------------------------------------------------

    def _needed_libs(self, check: str, objects: list[str]) -> report.Result:
        missing: list[str] = []
        driver: set[str] = set()
        for path in objects:
            info = self.loader.info(path)
            for name in info.needed:
                if self.loader.resolve(name, info) is None:
                    if name in library_loader.DRIVER_LIBRARIES:
                        driver.add(name)
                    else:
                        missing.append(f"{_relative(path, self.env)} needs {name}")
        if missing:
            return report.failed(check, _listing(f"{len(missing)} needed libraries not found",
                                                 missing))
        note = f"; driver libraries come from the GPU host: {', '.join(sorted(driver))}" \
            if driver else ""
        return report.passed(check, f"{len(objects)} shared objects, all needed libraries "
                                    f"found{note}")

    # -- symbol versions -----------------------------------------------------

    def _symbol_versions(self, check: str, objects: list[str]) -> report.Result:
        missing: list[str] = []
        checked = 0
        for path in objects:
            info = self.loader.info(path)
            for file, versions in sorted(info.version_needs.items()):
                provider = self.loader.resolve(file, info)
                if provider is None:
                    continue  # reported by needed-libs
                absent = sorted(versions - self.version_defs(provider))
                checked += len(versions)
                if absent:
                    missing.append(f"{_relative(path, self.env)} needs {', '.join(absent)} "
                                   f"from {provider}")
        if missing:
            return report.failed(check, _listing("symbol versions not provided", missing))
        return report.passed(check, f"{checked} symbol versions needed, all provided")

    def version_defs(self, path: str) -> set[str]:
        if path not in self._version_defs:
            with elf.ElfFile(path) as obj:
                self._version_defs[path] = obj.version_defs
        return self._version_defs[path]

    # -- undefined symbols ---------------------------------------------------

    def _undefined_symbols(self, check: str, objects: list[str]) -> report.Result:
        unresolved: list[str] = []
        incomplete: list[str] = []
        total = 0
        global_paths = list(dict.fromkeys(self.global_scope.values()))
        for path in objects:
            loaded, missing = self.loader.closure(path)
            if any(name not in library_loader.DRIVER_LIBRARIES for _, name in missing):
                incomplete.append(_relative(path, self.env))  # its symbols' providers are absent
                continue
            driver_absent = bool(missing)
            scope = global_paths + [where for where in loaded.values() if where != path]
            with elf.ElfFile(path) as obj:
                wanted = [symbol.name for symbol in obj.dynamic_symbols()
                          if not symbol.defined and not symbol.weak
                          and not (driver_absent and _DRIVER_SYMBOL.match(symbol.name))]
            total += len(wanted)
            providers = [self.defined(provider) for provider in [path] + scope]
            for name in wanted:
                if not any(name in names for names in providers):
                    unresolved.append(f"{_relative(path, self.env)}: {name}")
        note = _listing("; not checked, needed libraries missing (see abi.needed-libs)",
                        incomplete) if incomplete else ""
        if unresolved:
            return report.failed(check, _listing("undefined symbols", unresolved) + note)
        if len(incomplete) == len(objects):
            return report.skipped(check, "no object has all its needed libraries" + note)
        return report.passed(check, f"{total} undefined symbols of "
                                    f"{len(objects) - len(incomplete)} shared objects all "
                                    f"resolve{note}")

    def defined(self, path: str) -> set[str]:
        if path not in self._defined:
            with elf.ElfFile(path) as obj:
                self._defined[path] = {symbol.name for symbol in obj.dynamic_symbols()
                                       if symbol.defined}
        return self._defined[path]

    # -- C++ ABI -------------------------------------------------------------

    def cxx11(self) -> report.Result:
        check = "abi.cxx11"
        facts = self.env.torch_facts()
        if "error" in facts:
            return report.failed(check, f"cannot read torch's ABI flag: {facts['error']}")
        torch_abi = 1 if facts["cxx11_abi"] else 0
        mismatched, agreeing, dual = [], 0, []
        for distribution in extension_distributions(self.env):
            if not self.env.in_stack(distribution):
                continue
            for path in shared_objects(self.env, distribution):
                with elf.ElfFile(path) as obj:
                    undefined = [symbol.name for symbol in obj.dynamic_symbols() if not symbol.defined]
                abis, facing = string_abis(undefined), torch_facing_abis(undefined)
                # A mismatch: a string crosses into torch with the other ABI, or the object knows only
                # the other one. Both ABIs inside one object is libstdc++'s dual ABI, not a mismatch,
                # as long as what reaches torch agrees.
                if facing - {torch_abi} or (abis and torch_abi not in abis):
                    found = "/".join(str(abi) for abi in sorted(abis | facing))
                    mismatched.append(f"{_relative(path, self.env)} uses _GLIBCXX_USE_CXX11_ABI="
                                      f"{found}")
                elif abis:
                    agreeing += 1
                    if len(abis) > 1:
                        dual.append(_relative(path, self.env))
        if mismatched:
            return report.failed(check, _listing(f"torch has _GLIBCXX_USE_CXX11_ABI={torch_abi}",
                                                 mismatched))
        note = (f"; {len(dual)} also use the other ABI inside, where no string reaches torch: "
                f"{', '.join(dual)}") if dual else ""
        return report.passed(check, f"torch _GLIBCXX_USE_CXX11_ABI={torch_abi}; {agreeing} "
                                    f"extension objects pass std::string with the same ABI{note}")


_TORCH_SYMBOLS = ("_ZN3c10", "_ZN2at", "_ZN5torch", "_ZNK3c10", "_ZNK2at", "_ZNK5torch")


def torch_facing_abis(undefined: object) -> set[int]:
    """The std::string ABIs of the undefined symbols that are torch's own (c10, at, torch): what a
    string crossing into torch is built as."""
    return string_abis(name for name in undefined if name.startswith(_TORCH_SYMBOLS))


def string_abis(undefined: object) -> set[int]:
    """Which std::string ABIs undefined symbols use: {1} new (std::__cxx11), {0} old, or both."""
    return set().union(*(_symbol_abis(name) for name in undefined))


def _symbol_abis(name: str) -> set[int]:
    """The std::string ABIs one mangled name uses.

    New-ABI code names `std::__cxx11::`; old-ABI code calls libstdc++'s reference-counted string
    (`_ZNSs...`, `_ZNKSs...`) and passes it to torch as `Ss` (`...RKSs`).
    """
    abis: set[int] = set()
    if "St7__cxx11" in name or "B5cxx11" in name:
        abis.add(1)
    if name.startswith(("_ZNSs", "_ZNKSs")) or (name.startswith(_TORCH_SYMBOLS) and "RKSs" in name):
        abis.add(0)
    return abis


def _relative(path: str, env: Environment) -> str:
    site = str(env.site_packages())
    for root in [site] + [entry for entry in sys.path if entry]:
        if path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1:]
    return path


def _listing(headline: str, items: list[str]) -> str:
    shown = "; ".join(items[:_SHOWN])
    more = f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return f"{headline}: {shown}{more}"
