"""What every smoke check needs to know about the environment it runs in.

The smoke program runs under the image's venv interpreter, so the installed
distributions are read in-process with importlib.metadata; anything that may
crash (importing torch, loading CUDA extensions) runs in a child interpreter.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from builder.runtime.binaries import loader as library_loader

IMPORT_TIMEOUT_S = 600
T, R = TypeVar("T"), TypeVar("R")
_LOADER_MARKERS = ("undefined symbol", "cannot open shared object file", "version `")
# The distributions that have shipped the sgl_kernel module, oldest name first.
KERNEL_DISTRIBUTIONS = ("sgl-kernel", "sglang-kernel")


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None  # None: timed out
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self) -> str:
        """One line saying why the child failed: its last error line, a signal, or a timeout."""
        if self.returncode is None:
            return self.stderr
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            last = f" after: {lines[-1]}" if lines else ""
            return f"killed by {name}{last}"
        if not lines:
            return f"exit status {self.returncode} with no message"
        # A loader message says what broke; wrappers (sgl_kernel's loader) bury it mid-output.
        telling = [line for line in lines if any(marker in line for marker in _LOADER_MARKERS)]
        return (telling[0] if telling else lines[-1]).lstrip("- ")


def run_python(args: list[str], timeout: float = IMPORT_TIMEOUT_S,
               env: dict[str, str] | None = None) -> ChildResult:
    """Run this interpreter with `args` in a neutral working directory."""
    try:
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=timeout, cwd="/", env=env)
    except subprocess.TimeoutExpired:
        return ChildResult(None, "", f"timed out after {timeout:.0f} s")
    return ChildResult(done.returncode, done.stdout, done.stderr)


_TORCH_PROBE = textwrap.dedent("""
    import json, torch
    print(json.dumps({
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "file": torch.__file__,
    }))
""")


def side_by_side(function: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """function(item) for every item at once, results in the items' order. The checks' work is child
    interpreters, so threads overlap it on every core."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(function, items))


class Environment:
    """The stack description plus lazily gathered facts about the interpreter's packages."""

    def __init__(self, info: dict, gpu_expect_offset: float = 0.0):
        self.info = info
        # Added to every reference value of the GPU computations: a non-zero
        # offset plants a wrong expectation, which those checks must report.
        self.gpu_expect_offset = gpu_expect_offset
        self._torch: dict | None = None
        self._torch_lock = threading.Lock()  # checks run concurrently; probe torch once

    @property
    def stack(self) -> str:
        return self.info["stack"]

    @property
    def pinned(self) -> dict[str, str]:
        return self.info["distributions"]

    def in_stack(self, distribution: str) -> bool:
        return normalize(distribution) in {normalize(name) for name in self.pinned}

    def kernel_distribution(self) -> str:
        """The distribution that provides sgl_kernel here: sgl-kernel, or sglang-kernel, its name from
        0.4 on (SGLang 0.5.10 and later). The first name when the stack pins neither."""
        return next((name for name in KERNEL_DISTRIBUTIONS if self.in_stack(name)), KERNEL_DISTRIBUTIONS[0])

    def installed_version(self, distribution: str) -> str | None:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def distribution_files(self, distribution: str) -> list[Path]:
        """Absolute paths of the files a distribution installed (its RECORD), existing ones only."""
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return []
        paths = (Path(dist.locate_file(entry)).resolve() for entry in dist.files or [])
        return sorted({path for path in paths if path.is_file()})

    def installed_distributions(self) -> dict[str, str]:
        """{normalized name: version} of everything importlib.metadata sees, first one wins."""
        found: dict[str, str] = {}
        for dist in importlib.metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                found.setdefault(normalize(name), dist.version)
        return found

    def torch_facts(self) -> dict:
        """torch's version, CUDA version and CXX11 ABI flag, read in a child interpreter.

        {"error": "..."} when torch cannot be imported.
        """
        with self._torch_lock:
            if self._torch is None:
                child = run_python(["-c", _TORCH_PROBE])
                if child.ok:
                    self._torch = json.loads(child.stdout.strip().splitlines()[-1])
                else:
                    self._torch = {"error": child.reason()}
            return self._torch

    def driver_present(self) -> bool:
        """Whether the NVIDIA driver's libcuda.so.1 is visible to the loader (a GPU container)."""
        loader = library_loader.Loader()
        return "libcuda.so.1" in loader.cache or any(
            os.path.exists(os.path.join(directory, "libcuda.so.1"))
            for directory in loader.ld_library_path + list(library_loader.DEFAULT_DIRS))

    @staticmethod
    def site_packages() -> Path:
        import sysconfig
        return Path(sysconfig.get_paths()["purelib"])


def normalize(name: str) -> str:
    """PEP 503 name normalization: Flashinfer_Python -> flashinfer-python."""
    out = []
    for char in name.lower():
        out.append("-" if char in "-_." else char)
    normalized = "".join(out)
    while "--" in normalized:
        normalized = normalized.replace("--", "-")
    return normalized
