"""nvcc whose objects do not depend on its process id, with ptxas running in several threads.

    python -I -B stable_nvcc.py REAL_NVCC ARGS...   (what cuda-home/bin/nvcc runs; cuda_home.assemble)

nvcc names its temporary files tmpxft_<its pid as 8 hex digits>_<a counter> and writes that name into
the object it makes (the fatbinary's wrapper and the static initialiser's symbols). A pid depends on
what else ran first, so two builds of one source could give two objects, and so two image ids
(docs/cuda13.md). This runs the real nvcc as a child, so it knows that pid, and then rewrites the name
in the output file (-o) to one of the same length made from the output's path: the same on every
build, and still different for each object of a module. Nothing else in the file moves, and a module
linked from such objects gets the same build id.

It also passes ptxas `--split-compile PTXAS_THREADS`: ptxas then compiles the device functions of one
file in that many threads. The machine code is the same as one thread's (every section of the cubin
equal, measured on FlashInfer's trtllm_allreduce_fusion.cu: 4,512 sections, for 1, 2, 4 and 8 threads);
only the note in which ptxas records its own options differs. That file is the longest single job of
the bake, and its ptxas took 137 s in one thread, 78 s in two and 98 s in four on 2 cores
(docs/cuda13.md). The count is fixed, not the host's CPU count, so that note is the same on every host.

Standard library only (runs inside the image).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

_OUTPUT_FLAGS = ("-o", "--output-file")
PTXAS_THREADS = 2
PTXAS_SPLIT = f"-Xptxas=--split-compile={PTXAS_THREADS}"


def output_file(args: list[str]) -> str | None:
    """The file nvcc writes (-o FILE, -o=FILE, --output-file FILE or =FILE), or None."""
    for index, arg in enumerate(args):
        if arg in _OUTPUT_FLAGS and index + 1 < len(args):
            return args[index + 1]
        for flag in _OUTPUT_FLAGS:
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1:]
    return None


def pid_name(pid: int) -> bytes:
    return b"tmpxft_%08x_" % pid


def stable_name(output: str) -> bytes:
    return b"tmpxft_" + hashlib.sha256(output.encode()).hexdigest()[:8].encode() + b"_"


def rewrite(path: Path, pid: int, output: str) -> int:
    """Replace nvcc's pid-made name in `path` by the one made from `output`; returns how many were
    replaced. The file is replaced whole (a temporary beside it, then renamed), keeping its mode."""
    data = path.read_bytes()
    count = data.count(pid_name(pid))
    if count:
        partial = path.with_name(path.name + ".stable-nvcc")
        partial.write_bytes(data.replace(pid_name(pid), stable_name(output)))
        os.chmod(partial, path.stat().st_mode & 0o7777)
        os.replace(partial, path)
    return count


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: stable_nvcc.py REAL_NVCC ARGS...", file=sys.stderr)
        return 2
    real, args = argv[0], argv[1:]
    child = subprocess.Popen([real, *args, PTXAS_SPLIT])
    status = child.wait()
    output = output_file(args)
    if status == 0 and output is not None and Path(output).is_file():
        rewrite(Path(output), child.pid, output)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
