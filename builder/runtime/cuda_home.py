"""A CUDA_HOME made from the default index's CUDA wheels, for nvcc and FlashInfer's JIT.

The CUDA 13 wheels install the compiler and runtime under site-packages/nvidia/cu13/{bin,include,lib,nvvm}.
FlashInfer's JIT (flashinfer/jit/cpp_ext.py) expects a toolkit's layout: $CUDA_HOME/bin/nvcc and
`-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda`. This builds that layout from links into
the wheels, plus the two link-time names the wheels lack: libcudart.so (the wheel has libcudart.so.13
only) and a stub libcuda.so whose SONAME is the driver's libcuda.so.1, made with the host compiler: what
a toolkit's lib64/stubs holds, so the driver library the container gets at run time is the one loaded.
bin/nvcc is a launcher of stable_nvcc.py, so the objects it makes do not depend on nvcc's pid.

Standard library only (runs inside the image).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

WHEEL_ROOT = ("nvidia", "cu13")
_LINKED = ("include", "nvvm")
# -B: -I ignores PYTHONDONTWRITEBYTECODE, and the bake must leave no bytecode in site-packages (the
# byte-compile after it writes every module's, docs/write-once.md).
_LAUNCHER = """#!/bin/sh
# nvcc with its pid taken out of the objects it writes (stable_nvcc.py)
exec {python} -I -B {stable} {nvcc} "$@"
"""


def wheel_toolkit(site_packages: str | None = None) -> Path | None:
    """site-packages/nvidia/cu13 when the nvcc wheel is installed there, else None."""
    root = Path(site_packages or sysconfig.get_paths()["purelib"]).joinpath(*WHEEL_ROOT)
    return root if (root / "bin" / "nvcc").is_file() else None


def assemble(target: Path, toolkit: Path, compiler: str = "gcc") -> Path:
    """Make `target` a CUDA_HOME over `toolkit` (idempotent); returns target. Raises OSError or
    subprocess.CalledProcessError when a link or the stub cannot be made."""
    target.mkdir(parents=True, exist_ok=True)
    for name in _LINKED:
        _link(target / name, toolkit / name)
    _bin(target / "bin", toolkit / "bin")
    lib64 = target / "lib64"
    (lib64 / "stubs").mkdir(parents=True, exist_ok=True)
    for entry in sorted((toolkit / "lib").iterdir()):
        _link(lib64 / entry.name, entry)
    _link(lib64 / "libcudart.so", toolkit / "lib" / "libcudart.so.13")
    stub = lib64 / "stubs" / "libcuda.so"
    if not stub.is_file():
        source = lib64 / "stubs" / "libcuda-stub.c"
        source.write_text("/* link-time stand-in for the driver's libcuda.so.1 */\n")
        partial = stub.with_name(stub.name + ".partial")
        subprocess.run([compiler, "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(partial), str(source)],
                       check=True, capture_output=True, text=True)
        os.replace(partial, stub)
        source.unlink()
    return target


def _bin(path: Path, tools: Path) -> None:
    """bin/: a link to each of the wheel's tools but nvcc, and nvcc's launcher."""
    if path.is_symlink():
        path.unlink()  # a CUDA_HOME assembled before the launcher linked bin/ whole
    path.mkdir(exist_ok=True)
    for entry in sorted(tools.iterdir()):
        if entry.name != "nvcc":
            _link(path / entry.name, entry)
    launcher = _LAUNCHER.format(python=shlex.quote(sys.executable),
                                stable=shlex.quote(str(Path(__file__).with_name("stable_nvcc.py"))),
                                nvcc=shlex.quote(str(tools / "nvcc")))
    nvcc = path / "nvcc"
    if nvcc.is_symlink() or not nvcc.is_file() or nvcc.read_text() != launcher:
        partial = nvcc.with_name("nvcc.partial")
        partial.write_text(launcher)
        partial.chmod(0o755)
        os.replace(partial, nvcc)


def _link(path: Path, to: Path) -> None:
    if path.is_symlink() and os.readlink(path) == str(to):
        return
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(to)
