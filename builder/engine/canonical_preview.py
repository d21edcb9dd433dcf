"""The canonical form (builder/oci/canonical.py) of an image the engine built itself from the rendered
Dockerfile (`buildah build`), computed and never stored: its config, and so its id. It is how the
Dockerfile is proven to be the spec: the engine's image, put in canonical form, must be the image the
builder wrote (engine/write_once.py), file for file (docs/engines.md). The bench's bare engine build and
the engine-version tests compare the two ids.

The engine's layers are read through its public interface only: one `buildah push` of the image as a
docker-archive into a pipe, which buildah writes one layer at a time (it spools each layer to find its
size, then streams it). Each layer above the base is rewritten into a hash as it passes; nothing is
kept. The base's layers are taken as they are, as the builder takes them.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from builder.errors import BuildFailure
from builder.oci import canonical

# A layer in a docker-archive: "<diff_id hex>.tar" (or the older "<hex>/layer.tar", a link to it in newer writers).
_LAYER_MEMBER = re.compile(r"^([0-9a-f]{64})(?:\.tar|/layer\.tar)$")


@dataclass(frozen=True)
class NativeImage:
    """The engine's image as inspected: config, and each layer's diff_id and step."""

    image_id: str
    config: dict
    diff_ids: tuple[str, ...]
    steps: tuple[str, ...]
    base_layers: int  # leading layers that are the base image's own, never rewritten
    base_history: int  # leading history entries that are the base's


class _Discard:
    """A sink that keeps nothing: the rewrite's own hashing gives the diff_id."""

    def write(self, data: bytes) -> int:
        return len(data)


def canonical_config(buildah: Sequence[str], native: NativeImage, workdir: Path) -> bytes:
    """The config (and so the id) of the canonical form of `native`; `buildah` is the command and its
    global options, `workdir` where buildah spools the layer in flight."""
    drops = _drops(native)
    made: dict[tuple[str, bool], str] = {}
    wanted = {(native.diff_ids[i], drops[i]) for i in range(native.base_layers, len(native.diff_ids))}
    workdir.mkdir(parents=True, exist_ok=True)
    with _pushed_archive(buildah, native.image_id, workdir) as archive:
        for member in archive:
            name = _LAYER_MEMBER.match(member.name)
            if not member.isreg() or name is None:
                continue
            diff_id = f"sha256:{name.group(1)}"
            flags = sorted(drop for layer, drop in wanted if layer == diff_id)
            if flags:
                made.update(_rewritten(archive.extractfile(member), diff_id, flags, workdir))
    missing = wanted - made.keys()
    if missing:
        raise BuildFailure(f"buildah's archive of {native.image_id} lacks layer {sorted(missing)[0][0]}")
    diff_ids = [diff_id if i < native.base_layers else made[(diff_id, drops[i])]
                for i, diff_id in enumerate(native.diff_ids)]
    return canonical.canonical_config(native.config, diff_ids, native.base_history)


def _drops(native: NativeImage) -> list[bool]:
    """Per layer: whether its engine stubs go (RUN steps above the base)."""
    return [i >= native.base_layers and canonical.is_run_step(step) for i, step in enumerate(native.steps)]


def _rewritten(stream: IO[bytes], diff_id: str, flags: list[bool], workdir: Path) -> dict[tuple[str, bool], str]:
    """The canonical diff_id of layer `diff_id` for each way of treating its stubs it is used with. The
    stream is read once; only a layer used both ways (an empty RUN and an empty COPY alike) is spooled
    to read it twice."""
    if len(flags) == 1:
        return {(diff_id, flags[0]): canonical.rewrite_layer(stream, _Discard(), flags[0], diff_id).diff_id}
    with tempfile.TemporaryFile(dir=workdir) as spool:
        while chunk := stream.read(1 << 20):
            spool.write(chunk)
        result = {}
        for drop in flags:
            spool.seek(0)
            result[(diff_id, drop)] = canonical.rewrite_layer(spool, _Discard(), drop, diff_id).diff_id
        return result


@contextlib.contextmanager
def _pushed_archive(buildah: Sequence[str], image_id: str, workdir: Path) -> Iterator[tarfile.TarFile]:
    """`buildah push IMAGE docker-archive:` into a pipe, read as a tar going forward only. Leaving the
    block waits for buildah: a failed buildah is the error said (it is the cause of whatever the reading
    made of its archive), else an unreadable archive is; one cut short fails on its last layer's digest."""
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile(dir=workdir) as errors, os.fdopen(read_end, "rb") as stream:
        try:
            # buildah opens the pipe by its /dev/fd path: docker-archive takes a pipe as well as a file.
            process = subprocess.Popen(
                [*buildah, "push", "--quiet", image_id, f"docker-archive:/dev/fd/{write_end}"],
                pass_fds=(write_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                env={**os.environ, "TMPDIR": str(workdir)})
        finally:
            os.close(write_end)
        failed: BuildFailure | tarfile.TarError | None = None
        try:
            yield tarfile.TarFile(fileobj=canonical.ForwardReader(stream), mode="r")
        except (BuildFailure, tarfile.TarError) as error:
            failed = error
        finally:
            stream.close()  # a buildah still writing gets EPIPE and stops
            status = process.wait()
        if status != 0:
            errors.seek(0)
            message = errors.read().decode(errors="replace").strip().splitlines()
            raise BuildFailure(f"buildah push of {image_id} failed: {message[-1] if message else status}")
        if isinstance(failed, tarfile.TarError):
            raise BuildFailure(f"buildah's archive of {image_id} is no readable tar: {failed}") from None
        if failed is not None:
            raise failed
