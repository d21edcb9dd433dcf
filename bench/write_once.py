"""The write-once build (builder/engine/write_once.py) of a real row, against the lock's image id.

    python bench/write_once.py [--stack sglang-0.5.9-cu128-local]

Stages the row's context as `builder build` does (wheels from the host cache, which must be warm:
`builder fetch`), writes every layer once through one buildah working container into a scratch OCI
layout, imports the layout into buildah's storage, and records:
  seconds           the write and the import, wall clock
  bytes_written     the process tree's writes (this process and every reaped descendant: buildah,
                    runc, pip in the container), from getrusage's block counts
  peak_disk_bytes   the most the filesystem of the layout gained, sampled twice a second
  image_id          the written image's id, and whether it is the id matrix.lock records for the row
                    (built by the engine and put in canonical form)
Writes bench/results/write-once.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.config.matrix import load_matrix  # noqa: E402
from builder.engine import write_once  # noqa: E402
from builder.engine.buildah import BuildahEngine  # noqa: E402
from builder.engine.progress import Progress  # noqa: E402
from builder.image import build, context, wheel_cache  # noqa: E402
from builder.lock.resolution import base_pin, check_current  # noqa: E402
from builder.oci.layout import scratch_layout  # noqa: E402
from builder.paths import Project  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "write-once.json"
_BLOCK = 512  # getrusage's ru_oublock unit


def written_bytes() -> int:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_oublock
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock
    return (own + children) * _BLOCK


class PeakDisk:
    """The filesystem's used bytes, sampled twice a second; the peak over what was used at start."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak, self._stop = path, 0, threading.Event()
        self.start = self._used()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _used(self) -> int:
        usage = shutil.disk_usage(self.path)
        return usage.total - usage.free

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self._used() - self.start)

    def __enter__(self) -> "PeakDisk":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.9-cu128-local")
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    options = parser.parse_args()
    stack = load_matrix(ROOT / "matrix.toml").stack(options.stack)
    project = Project(ROOT)
    entry = check_current(stack, project.lock)
    inputs = context.build_inputs(stack, project.root, base_pin(stack, entry.resolution))
    cache = wheel_cache.WheelCache()
    cache.require(wheel_cache.locked_wheels(entry.resolution), stack.name)
    engine = BuildahEngine(export_to_docker=False)
    tag = f"localhost/bench-write-once:{stack.name}"
    work = options.workdir / "bench-write-once"
    with tempfile.TemporaryDirectory(prefix="builder-context-", dir=cache.root) as scratch:
        context_dir = Path(scratch) / "context"
        dockerfile = build.stage_context(inputs, project.root, entry.resolution, cache, context_dir)
        request = build.build_request(stack, context_dir, dockerfile, tag, False, Progress.for_environment())
        before, started = written_bytes(), time.monotonic()
        with PeakDisk(options.workdir) as disk, scratch_layout(work, "layout") as layout:
            _, layers, image = write_once.write_image(engine.command, request, layout, work, "bench", print)
            wrote = time.monotonic() - started
            write_once.import_image(engine.command, layout, image.image_id, tag)
        seconds = time.monotonic() - started
        total_written = written_bytes() - before
    engine.remove(tag)
    image_bytes = sum(layer["size"] for layer in layers)
    locked = entry.outcome.image.image_id if entry.outcome.image else None
    result = {
        "stack": stack.name, "engine": f"buildah {engine.version()}",
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "image_id": image.image_id, "lock_image_id": locked, "same_id_as_lock": image.image_id == locked,
        "layers_written": image.layers_written, "image_bytes": image_bytes,
        "seconds_write": round(wrote, 1), "seconds_total": round(seconds, 1),
        "bytes_written": total_written, "bytes_written_over_image": round(total_written / image_bytes, 2),
        "peak_disk_bytes": disk.peak, "peak_disk_over_image": round(disk.peak / image_bytes, 2),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
