"""Shared pieces of the engine, base and verify tests (the real base image itself is a conftest fixture)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


EPOCH = 1735689600  # 2025-01-01: a fixed date, never the wall clock
# The test base gets its own date, so its image ID differs from a base built for real use: one
# image under two names would make buildah's recorded FROM name (and so digests) ambiguous.
BASE_EPOCH = 1700000000
TEST_BASE_TAG = "localhost/builder-base-test:bookworm"


def write_context(directory: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    return directory


def tar_bytes(entries: dict[str, bytes], mtime: int = EPOCH) -> bytes:
    """A tar (in name order) holding regular files: a tiny, real layer."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size = len(entries[name])
            info.mtime = mtime
            archive.addfile(info, io.BytesIO(entries[name]))
    return buffer.getvalue()


def engine_image(engine, request):
    """The engine's own build of `request` (`buildah build`) in canonical form, computed, not stored:
    the image the builder's own build of the same Dockerfile must be, id for id."""
    return engine.canonical_preview(engine.build_native(request), request)
