"""The read tracer the smoke gate puts into a smoke container (sitecustomize.py here), and its output.

It goes in with the Docker API's archive upload before the container starts and its records come back
the same way after it ends, so no image carries it and none of its files is in a layer.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

PARENT = "/tmp"
_ROOT = "builder-reads"
LIBRARY = f"{PARENT}/{_ROOT}/lib"
OUT = f"{PARENT}/{_ROOT}/out"
_SOURCE = Path(__file__).with_name("sitecustomize.py")


def environment(pythonpath: str) -> dict[str, str]:
    """The tracer first on the path, the in-image tools after it, and where each process writes."""
    return {"PYTHONPATH": f"{LIBRARY}:{pythonpath}", "BUILDER_READS_OUT": OUT}


def archive() -> bytes:
    """The tar put under PARENT: the tracer, and an output directory every user may write."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in ((_ROOT, 0o755), (f"{_ROOT}/lib", 0o755), (f"{_ROOT}/out", 0o1777)):
            directory = tarfile.TarInfo(name)
            directory.type, directory.mode = tarfile.DIRTYPE, mode
            tar.addfile(directory)
        source = _SOURCE.read_bytes()
        module = tarfile.TarInfo(f"{_ROOT}/lib/sitecustomize.py")
        module.size, module.mode = len(source), 0o644
        tar.addfile(module, io.BytesIO(source))
    return buffer.getvalue()


def traces(output_tar: bytes) -> list[str]:
    """Each process's record from the archive of OUT that the container API hands back."""
    texts = []
    with tarfile.open(fileobj=io.BytesIO(output_tar), mode="r:") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".reads"):
                handle = tar.extractfile(member)
                if handle is not None:
                    texts.append(handle.read().decode("utf-8", "surrogateescape"))
    return texts
