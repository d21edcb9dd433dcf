"""Measure layer-cache efficiency on a real stack: cold build, no-op rebuild, rebuild after a patch change.

    python bench/build_cache.py [--stack sglang-0.5.9-cu128-local] [--engine buildah]

Targets: a no-op rebuild within 3% of the cold build, a one-line patch change within 10%.
Writes bench/results/build-cache.json and prints a Markdown table for bench/README.md.
The patch change is made to the patch file in place and undone afterwards; the builds record into a
scratch copy of matrix.lock, never the committed one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.image import build, render  # noqa: E402
from builder.engine import get_engine  # noqa: E402
from builder.config.matrix import load_matrix  # noqa: E402
from builder.engine.progress import Progress  # noqa: E402
from builder.paths import Project  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "build-cache.json"


def measured_build(stack, engine, progress, no_cache: bool) -> dict:
    """One full `builder build` (build, delivery into Docker, smoke, tags); its own durations."""
    started = time.monotonic()
    outcome = build.build_stack(stack, engine, progress, Project(ROOT), no_cache=no_cache)
    report = json.loads(outcome.report_path.read_text())
    durations = outcome.durations_s
    return {
        "engine_build_s": round(durations["build"] - durations["deliver_to_docker"], 1),
        "deliver_to_docker_s": durations["deliver_to_docker"],
        "smoke_s": durations["smoke"],
        "total_s": round(time.monotonic() - started, 1),
        "report": report,
    }


def with_patch_comment(stack):
    """Prepend a line to the last patch's header (text before the diff): a one-line patch change.
    The committed render is untouched: the build hashes and copies the patch file itself."""
    patch = render.rendered_patches(stack, ROOT / "patches")[-1]
    path = ROOT / patch.source
    original = path.read_bytes()
    path.write_bytes(b"bench: one-line change to measure the rebuild\n" + original)
    return path, original


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.9-cu128-local")
    parser.add_argument("--engine", default="buildah")
    args = parser.parse_args()
    scratch_lock = Path(tempfile.mkdtemp()) / "matrix.lock"
    shutil.copy(ROOT / "matrix.lock", scratch_lock)
    os.environ["BUILDER_LOCK"] = str(scratch_lock)
    stack = load_matrix(ROOT / "matrix.toml").stack(args.stack)
    engine = get_engine(args.engine)
    engine.check()
    progress = Progress.for_environment()

    cold = measured_build(stack, engine, progress, no_cache=True)
    noop = measured_build(stack, engine, progress, no_cache=False)
    path, original = with_patch_comment(stack)
    try:
        patched = measured_build(stack, engine, progress, no_cache=False)
    finally:
        path.write_bytes(original)

    def share(run: dict) -> float:
        return round(run["engine_build_s"] / cold["engine_build_s"], 4)

    results = {
        "stack": stack.name,
        "engine": args.engine,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "runs": {name: {k: v for k, v in run.items() if k != "report"}
                 for name, run in (("cold", cold), ("noop", noop), ("patch_change", patched))},
        "noop_ratio": share(noop),
        "patch_change_ratio": share(patched),
        "targets": {"noop_ratio": 0.03, "patch_change_ratio": 0.10},
        "image_bytes": sum(layer["bytes"] or 0 for layer in cold["report"]["layers"]),
        "patch_layers": cold["report"]["patch_layers"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("| rebuild | engine build s | share of cold | target | into Docker s | smoke s | total s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, target in (("cold", ""), ("noop", "<= 3%"), ("patch_change", "<= 10%")):
        run = results["runs"][name]
        print(f"| {name} | {run['engine_build_s']} | {run['engine_build_s'] / cold['engine_build_s']:.1%} | {target} "
              f"| {run['deliver_to_docker_s']} | {run['smoke_s']} | {run['total_s']} |")
    for layer in results["patch_layers"]:
        name = layer["step"].rsplit("/", 1)[-1].strip('"]')
        print(f"| patch layer {name} | {layer['bytes']} bytes | | < 64 KiB | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
