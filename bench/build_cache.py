"""What a `builder build` costs the user, whole (wheels, engine, delivery into Docker, smoke, report,
SBOM, lock), in the situations that matter:

  cold          empty engine storage, empty wheel cache, the image absent from the Docker daemon
  second_cold   empty engine storage, warm wheel cache, the image absent from the Docker daemon
  noop          nothing changed since the last build
  patch_change  one line added to the last patch file's header
  runtime_change one line added to an in-image tool (builder/runtime/)
  bare_engine   `buildah build` alone of the same Dockerfile and context, empty storage: the floor

    python bench/build_cache.py [--stack sglang-0.5.9-cu128-local] [--runs 3] [--cold-runs N]

Each figure is the median of --runs runs, with min and max; ratios are to the cold median. Cold
builds use private buildah storage (removed after each run) and a private wheel cache; the Docker
daemon's copy of the image is removed first. The lock is a scratch copy; build reports and edited
files are restored afterwards. Writes bench/results/build-cache.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.build_stack import build, context  # noqa: E402
from builder.cache import wheel_cache  # noqa: E402
from builder.config import tags  # noqa: E402
from builder.config.matrix import load_matrix  # noqa: E402
from builder.engine.buildah import BuildahEngine  # noqa: E402
from builder.engine.progress import Progress  # noqa: E402
from builder.lock.resolution import base_pin, check_current  # noqa: E402
from builder.oci.layer_diff import discard_storage  # noqa: E402
from builder.paths import Project  # noqa: E402
from builder.render import render  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "build-cache.json"
RUNTIME_FILE = ROOT / "builder" / "runtime" / "serve" / "progress.py"
TARGETS = {"noop": 0.03, "patch_change": 0.10, "second_cold": 0.50, "wall_minus_smoke_over_bare": 1.10}


def timed_build(stack, engine, cache, progress) -> dict:
    started = time.monotonic()
    outcome = build.build_stack(stack, engine, progress, Project(ROOT), cache=cache)
    wall = time.monotonic() - started
    provenance = json.loads(outcome.provenance_path.read_text())
    external = provenance["predicate"]["buildDefinition"]["externalParameters"]
    durations = outcome.durations_s
    return {"wall_s": round(wall, 1), "smoke_s": durations["smoke"], "engine_s": round(durations["build"] - durations["deliver_to_docker"], 1),
            "deliver_s": durations["deliver_to_docker"], "fetch_wheels_s": durations["fetch_wheels"],
            "wheel_bytes_downloaded": external["wheel_bytes_downloaded"],
            "delivered_bytes": external["delivered_bytes"], "image_id": outcome.image_id}


@contextmanager
def private_storage(scratch: Path):
    engine = BuildahEngine(storage_dir=scratch / "storage")
    try:
        yield engine
    finally:
        discard_storage(engine, engine.storage_dir)


def forget_in_docker(engine: BuildahEngine, stack) -> None:
    """Every image of the stack out of the Docker daemon (earlier builds share its layers), so
    delivery has everything to move."""
    moving = tags.moving_tag(stack)
    for image in engine.daemon.client.images.list():
        if any(tag == moving or tag.startswith(moving + "-") for tag in image.tags):
            engine.daemon.client.images.remove(image.id, force=True)


def base_into(engine: BuildahEngine, stack, scratch: Path) -> None:
    archive = scratch / "base.tar"
    BuildahEngine(export_to_docker=False).save(stack.base.image, archive)
    engine.load(archive)
    archive.unlink()


def cold_run(stack, scratch: Path, cache: wheel_cache.WheelCache, progress) -> dict:
    with private_storage(scratch) as engine:
        base_into(engine, stack, scratch)
        forget_in_docker(engine, stack)
        return timed_build(stack, engine, cache, progress)


def bare_engine_run(stack, scratch: Path, cache: wheel_cache.WheelCache, progress) -> dict:
    """The same Dockerfile and context through `buildah build` with nothing of the builder around it."""
    resolution = check_current(stack, Project(ROOT).lock).resolution
    inputs = context.build_inputs(stack, ROOT, base_pin(stack, resolution))
    with private_storage(scratch) as engine:
        base_into(engine, stack, scratch)
        engine.export_to_docker = False
        context_dir = scratch / "context"
        dockerfile = build.stage_context(inputs, ROOT, resolution, cache, context_dir)
        started = time.monotonic()
        engine.build_native(build.build_request(stack, context_dir, dockerfile, "localhost/bench-bare:latest", False,
                                                progress))
        wall = time.monotonic() - started
        shutil.rmtree(context_dir)
        return {"wall_s": round(wall, 1)}


@contextmanager
def one_line_added(path: Path, line: bytes):
    original = path.read_bytes()
    path.write_bytes(line + original)
    try:
        yield
    finally:
        path.write_bytes(original)


def summary(runs: list[dict]) -> dict:
    walls = [run["wall_s"] for run in runs]
    return {"median_s": round(statistics.median(walls), 1), "min_s": min(walls), "max_s": max(walls), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.9-cu128-local")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold-runs", type=int, help="runs of the three cold figures (default: --runs)")
    parser.add_argument("--scratch", type=Path, default=ROOT / "build" / "bench",
                        help="private storages and wheel cache (about 20 GB while a cold run lasts)")
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    os.environ["BUILDER_LOCK"] = str(args.scratch / "matrix.lock")
    shutil.copy(ROOT / "matrix.lock", os.environ["BUILDER_LOCK"])
    stack = load_matrix(ROOT / "matrix.toml").stack(args.stack)
    progress = Progress.for_environment()
    reports = {p: p.read_bytes() for p in (ROOT / "build-reports").glob(f"{stack.name}.*")}
    shared, default_cache = BuildahEngine(), wheel_cache.WheelCache()
    runs: dict[str, list[dict]] = {name: [] for name in ("cold", "second_cold", "bare_engine", "noop", "patch_change",
                                                          "runtime_change")}
    try:
        for _ in range(args.cold_runs or args.runs):
            cold_cache = wheel_cache.WheelCache(args.scratch / "wheels")
            shutil.rmtree(cold_cache.root, ignore_errors=True)
            runs["cold"].append(cold_run(stack, args.scratch, cold_cache, progress))
            runs["second_cold"].append(cold_run(stack, args.scratch, cold_cache, progress))
            runs["bare_engine"].append(bare_engine_run(stack, args.scratch, cold_cache, progress))
            shutil.rmtree(cold_cache.root, ignore_errors=True)
        def head() -> dict:
            return timed_build(stack, shared, default_cache, progress)

        head()  # the shared storage, the daemon and the lock hold HEAD's image and its smoke pass
        for _ in range(args.runs):
            runs["noop"].append(head())
        # Each change is new (its run number in it), so no run finds the previous one's layers or
        # smoke pass; each starts from HEAD's image, rebuilt (untimed) after the change is undone.
        patch = ROOT / render.rendered_patches(stack, ROOT / "patches")[-1].source
        for number in range(args.runs):
            with one_line_added(patch, f"bench: one-line change {number} to the patch's header\n".encode()):
                runs["patch_change"].append(head())
            head()
        for number in range(args.runs):
            with one_line_added(RUNTIME_FILE, f"# bench: one-line change {number} to an in-image tool\n".encode()):
                runs["runtime_change"].append(head())
            head()
    finally:
        for path, data in reports.items():
            path.write_bytes(data)
    results = {name: summary(found) for name, found in runs.items()}
    cold = results["cold"]["median_s"]
    ratios = {name: round(results[name]["median_s"] / cold, 4)
              for name in ("noop", "patch_change", "runtime_change", "second_cold")}
    bare = results["bare_engine"]["median_s"]
    for name in ("cold", "second_cold"):
        smoke = statistics.median(run["smoke_s"] for run in runs[name])
        ratios[f"wall_minus_smoke_over_bare{'' if name == 'cold' else '_second_cold'}"] = round(
            (results[name]["median_s"] - smoke) / bare, 4)
    document = {"stack": stack.name, "engine": "buildah", "runs_per_figure": args.runs,
                "runs_per_cold_figure": args.cold_runs or args.runs,
                "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
                "measured": time.strftime("%Y-%m-%d", time.gmtime()),
                "results": results, "ratios_to_cold": ratios, "targets": TARGETS,
                "met": {name: ratios[name] <= target for name, target in TARGETS.items()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print("| build | median s | min s | max s | ratio | target | wheels downloaded | delivered to Docker |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, figure in results.items():
        last = figure["runs"][-1]
        ratio = ratios.get(name, "")
        print(f"| {name} | {figure['median_s']} | {figure['min_s']} | {figure['max_s']} | {ratio} | "
              f"{TARGETS.get(name, '')} | {last.get('wheel_bytes_downloaded', '')} | {last.get('delivered_bytes', '')} |")
    print(f"| wall minus smoke over bare engine (cold) | | | | {ratios['wall_minus_smoke_over_bare']} | 1.1 | | |")
    print(f"| wall minus smoke over bare engine (second cold) | | | | "
          f"{ratios['wall_minus_smoke_over_bare_second_cold']} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
