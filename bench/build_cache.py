"""Measure layer-cache efficiency on a real stack: cold build, no-op rebuild, rebuild after a patch change.

    python bench/build_cache.py [--stack sglang-0.5.9-cu128-local] [--engine buildah]

Targets: a no-op rebuild within 3% of the cold build, a one-line patch change within 10%.
Writes bench/results/build-cache.json and prints a Markdown table for bench/README.md.
The patch change is made on a scratch copy of the patch file and undone afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder import build, render  # noqa: E402
from builder.engine import get_engine  # noqa: E402
from builder.matrix import load_matrix  # noqa: E402
from builder.progress import Progress  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "build-cache.json"


def timed_build(stack, engine, progress, no_cache: bool) -> tuple[float, build.BuildOutcome]:
    started = time.monotonic()
    outcome = build.build_stack(stack, engine, progress, no_cache=no_cache)
    return time.monotonic() - started, outcome


def with_patch_comment(stack):
    """Append a comment line to the last patch's header (text before the diff): a one-line patch change."""
    patch = render.rendered_patches(stack)[-1]
    path = render.REPO_ROOT / patch.source
    original = path.read_bytes()
    path.write_bytes(b"bench: one-line change to measure the rebuild\n" + original)
    return path, original


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.9-cu128-local")
    parser.add_argument("--engine", default="buildah")
    args = parser.parse_args()
    stack = load_matrix(render.REPO_ROOT / "matrix.toml").stack(args.stack)
    engine = get_engine(args.engine)
    engine.check()
    progress = Progress.for_environment()

    cold, outcome = timed_build(stack, engine, progress, no_cache=True)
    noop, _ = timed_build(stack, engine, progress, no_cache=False)
    path, original = with_patch_comment(stack)
    try:
        render.write(render.render_all((stack,), render.lock_requirements))
        patched, _ = timed_build(stack, engine, progress, no_cache=False)
    finally:
        path.write_bytes(original)
        render.write(render.render_all((stack,), render.lock_requirements))

    report = json.loads(outcome.report_path.read_text())
    results = {
        "stack": stack.name,
        "engine": args.engine,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "cold_s": round(cold, 1),
        "noop_rebuild_s": round(noop, 1),
        "patch_change_rebuild_s": round(patched, 1),
        "noop_ratio": round(noop / cold, 4),
        "patch_change_ratio": round(patched / cold, 4),
        "targets": {"noop_ratio": 0.03, "patch_change_ratio": 0.10},
        "image_bytes": sum(layer["bytes"] or 0 for layer in report["layers"]),
        "patch_layers": report["patch_layers"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("| measure | seconds | share of cold | target |")
    print("| --- | --- | --- | --- |")
    print(f"| cold build | {results['cold_s']} | 100% | |")
    print(f"| no-op rebuild | {results['noop_rebuild_s']} | {results['noop_ratio']:.1%} | <= 3% |")
    print(f"| one-line patch change | {results['patch_change_rebuild_s']} | {results['patch_change_ratio']:.1%} | <= 10% |")
    for layer in results["patch_layers"]:
        name = layer["step"].rsplit("/", 1)[-1].strip('"]')
        print(f"| patch layer {name} | {layer['bytes']} bytes | | < 64 KiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
