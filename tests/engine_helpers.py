"""Shared pieces of the engine, base and verify tests: a real base image, built once per session."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from builder.image.local_base import BaseSpec, make_base
from builder.engine.buildah import BuildahEngine

EPOCH = 1735689600  # 2025-01-01: a fixed date, never the wall clock
# The test base gets its own date, so its image ID differs from a base built for real use: one
# image under two names would make buildah's recorded FROM name (and so digests) ambiguous.
BASE_EPOCH = 1700000000
TEST_BASE_TAG = "localhost/builder-base-test:bookworm"


_built_base = []


@pytest.fixture(scope="session")
def base_image(tmp_path_factory):
    """The real mmdebstrap base, loaded into buildah's storage and the Docker daemon.

    Test modules import this fixture, which gives each module its own fixture definition; the
    memo makes the base build once per session all the same."""
    if not _built_base:
        output = tmp_path_factory.mktemp("base")
        engine = BuildahEngine()
        spec = BaseSpec(source_date_epoch=BASE_EPOCH, tag=TEST_BASE_TAG)
        result = make_base(spec, output, engine=engine)
        engine.daemon.load(result.archive)
        _built_base.append(result)
    return _built_base[0]


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
