"""nvcc's pid taken out of the objects it writes (builder/runtime/stable_nvcc.py). The real nvcc wheel
is used in test_cuda13.py; here a compiler that behaves like it in that one respect: it writes
tmpxft_<its own pid>_00000000 into its -o file, which is all the wrapper may change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.runtime import cuda_home, stable_nvcc

WRAPPER = Path(stable_nvcc.__file__)
PID_WRITER = """import os, sys
out = sys.argv[sys.argv.index("-o") + 1]
open(out, "wb").write(b"head tmpxft_%08x_00000000-6_kernel body tmpxft_%08x_00000000_6_kernel tail"
                      % (os.getpid(), os.getpid()))
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def compiler(tmp_path) -> Path:
    path = tmp_path / "compiler"
    path.write_text(f"#!{sys.executable}\n{PID_WRITER}")
    path.chmod(0o755)
    return path


def compile_with(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(WRAPPER), *args], capture_output=True,
                          env={**os.environ, **(env or {})})


def test_two_compiles_in_two_processes_give_the_same_bytes(compiler, tmp_path):
    out = tmp_path / "k.o"
    outputs = []
    for _ in range(2):
        assert compile_with([str(compiler), "-c", "k.cu", "-o", str(out)]).returncode == 0
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    stable = stable_nvcc.stable_name(str(out))
    assert outputs[0].count(stable) == 2 and len(stable) == len(stable_nvcc.pid_name(1))
    subprocess.run([str(compiler), "-o", str(out)], check=True)  # the compiler alone: its pid is in the file
    assert stable not in out.read_bytes() and b"tmpxft_" in out.read_bytes()


def test_each_object_of_a_module_gets_its_own_name(compiler, tmp_path):
    names = set()
    for output in ("a.o", "b.o", "c.o"):
        assert compile_with([str(compiler), "-c", "x.cu", "-o", str(tmp_path / output)]).returncode == 0
        names.add((tmp_path / output).read_bytes()[5:29])
    assert len(names) == 3 and all(name.startswith(b"tmpxft_") for name in names)


@pytest.mark.parametrize("args, expected", [
    (["-c", "k.cu", "-o", "k.o"], "k.o"), (["-o=k.o", "-c", "k.cu"], "k.o"),
    (["--output-file", "k.o"], "k.o"), (["--output-file=k.o"], "k.o"), (["--version"], None), (["-o"], None)])
def test_the_output_file_is_read_as_nvcc_reads_it(args, expected):
    assert stable_nvcc.output_file(args) == expected


def test_a_failed_compile_is_left_alone_and_its_status_kept(compiler, tmp_path):
    out = tmp_path / "k.o"
    done = compile_with([str(compiler), "-o", str(out)], env={"EXIT": "3"})
    assert done.returncode == 3
    assert stable_nvcc.stable_name(str(out)) not in out.read_bytes()


def test_without_a_compiler_it_says_how_it_is_called():
    done = compile_with([])
    assert done.returncode == 2 and b"usage: stable_nvcc.py REAL_NVCC ARGS" in done.stderr


def test_the_cuda_home_nvcc_is_the_launcher_and_the_other_tools_are_links(compiler, tmp_path):
    toolkit = tmp_path / "cu13"
    for name in ("bin", "include", "nvvm", "lib"):
        (toolkit / name).mkdir(parents=True)
    (toolkit / "lib" / "libcudart.so.13").write_bytes(b"")
    (toolkit / "bin" / "nvcc").symlink_to(compiler)
    (toolkit / "bin" / "ptxas").write_text("")
    home = tmp_path / "home"
    (home / "lib64" / "stubs").mkdir(parents=True)
    (home / "lib64" / "stubs" / "libcuda.so").write_bytes(b"stub")  # the compiler's part: test_cuda13.py
    (home / "bin").symlink_to(toolkit / "bin")  # how a CUDA_HOME was assembled before the launcher
    cuda_home.assemble(home, toolkit)
    assert not (home / "bin").is_symlink()
    assert os.readlink(home / "bin" / "ptxas") == str(toolkit / "bin" / "ptxas")
    launcher = (home / "bin" / "nvcc").read_text()
    # -I ignores PYTHONDONTWRITEBYTECODE: -B keeps the bake from writing bytecode into site-packages.
    assert f"{sys.executable} -I -B " in launcher
    cuda_home.assemble(home, toolkit)
    assert (home / "bin" / "nvcc").read_text() == launcher  # again: unchanged
    out = tmp_path / "k.o"
    subprocess.run([str(home / "bin" / "nvcc"), "-c", "k.cu", "-o", str(out)], check=True)
    assert stable_nvcc.stable_name(str(out)) in out.read_bytes()
