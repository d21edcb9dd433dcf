"""What the image's trip into the engine's storage costs, against one plain extraction of the same layers:
the part of a cold write-once build that remains while its container steps and smoke checks need the
engine's storage (docs/write-once.md, "What remains").

    python bench/import_floor.py [--stack sglang-0.5.23-cu130-local] [--scratch /var/tmp/import-floor]

Reads the image that the row's committed build report names from the write-once layout under
BUILDER_CACHE (a build of that row must have run on this host). Each figure starts with the page cache
dropped and writes onto a fresh loop-mounted filesystem of its own (bench/cold_path.py's machinery):
  read      every layer blob read once: the source side of both others
  import    the builder's own import (builder/engine/write_once.import_image: `buildah pull oci:`, its
            staging on the memory filesystem where it fits) into empty storage
  extract   GNU tar extracting each layer, in order, into one directory: each byte written once
  overlay   the path that would replace the import: the layers below the first container step after
            the wheel groups (the byte-compile) each extracted into a directory of its own, stacked
            by overlayfs under a fresh upper directory, that step run there by runc with no network,
            and its layer written by the builder's writer (builder/oci/tree_layer.py); the layer must
            be the one the builder's build wrote (same diff_id), and each part is timed
Writes bench/results/import-floor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.engine import step_runner, write_once  # noqa: E402
from builder.lock import build_report  # noqa: E402
from builder.oci import canonical, dockerfile_plan, tree_layer  # noqa: E402
from builder.oci.layout import Layout  # noqa: E402
from builder.paths import cache_root  # noqa: E402
import cold_path as bench  # noqa: E402  (bench/, the script's own folder)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "import-floor.json"
_CHUNK = 1 << 20


def image_layers(layout: Layout, image_id: str) -> tuple[bytes, list[dict]]:
    """The image's config and its layer descriptors (uncompressed blobs: digest = diff_id)."""
    if not layout.has_blob(image_id):
        raise SystemExit(f"import_floor: {image_id} is not in {layout.root}: build the row on this host first")
    config = layout.read_blob(image_id)
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    missing = [diff_id for diff_id in diff_ids if not layout.has_blob(diff_id)]
    if missing:
        raise SystemExit(f"import_floor: {len(missing)} of the image's layers are not in {layout.root}")
    sizes = {diff_id: layout.blob_path(diff_id).stat().st_size for diff_id in diff_ids}
    return config, list(canonical.layer_descriptors(diff_ids, sizes))


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_part(part: str, stack: str, layout: Layout, image_id: str, target: Path) -> None:
    """One figure's work, run as its own process so that its process tree's writes are what is counted."""
    config, layers = image_layers(layout, image_id)
    if part == "read":
        for layer in layers:
            with layout.blob_path(layer["digest"]).open("rb") as handle:
                while handle.read(_CHUNK):
                    pass
    elif part == "import":
        target.mkdir(parents=True, exist_ok=True)
        write_once.import_image(["buildah"], layout, config, layers, target, "localhost/import-floor:probe")
    elif part == "extract":
        target.mkdir(parents=True, exist_ok=True)
        for layer in layers:
            subprocess.run(["tar", "-x", "--numeric-owner", "-f", str(layout.blob_path(layer["digest"])),
                            "-C", str(target)], check=True)
    elif part == "overlay":
        target.mkdir(parents=True, exist_ok=True)
        print(json.dumps(overlay_step(stack, layout, config, target)), flush=True)
    else:
        raise SystemExit(f"import_floor: no part {part!r}")


def first_step_after_groups(plan: dockerfile_plan.Plan) -> int:
    """The index of the first RUN step after the last wheel group's install step."""
    groups = [index for index, step in enumerate(plan.steps)
              if step.keyword == "RUN" and step.argv[1:5] == ("-I", "-B", write_once.INSTALL_TOOL, "install")]
    if not groups:
        raise SystemExit("import_floor: the Dockerfile installs no wheel group")
    return next(index for index in range(groups[-1] + 1, len(plan.steps)) if plan.steps[index].keyword == "RUN")


def overlay_step(stack: str, layout: Layout, config: bytes, target: Path) -> dict:
    """The overlay part (module docstring): returns its timings and whether the layer is the builder's."""
    data = json.loads(config)
    diff_ids = data["rootfs"]["diff_ids"]
    epoch = str(build_report.read(ROOT / "build-reports" / f"{stack}.json").source_date_epoch)
    plan = dockerfile_plan.parse((ROOT / "images" / stack / "Dockerfile").read_text(), {"SOURCE_DATE_EPOCH": epoch})
    index = first_step_after_groups(plan)
    layer_steps = [i for i, step in enumerate(plan.steps) if not step.empty_layer]
    base_layers = len(diff_ids) - len(layer_steps)
    below = diff_ids[:base_layers + layer_steps.index(index)]
    expected = diff_ids[len(below)]
    figures: dict = {"step": plan.steps[index].created_by[-160:], "layers_below": len(below)}
    started = time.monotonic()
    trees = []
    for number, diff_id in enumerate(below):
        tree = target / "trees" / f"{number}"
        tree.mkdir(parents=True)
        subprocess.run(["tar", "-x", "--numeric-owner", "--same-owner", "--same-permissions", "--xattrs",
                        "--xattrs-include=*", "-f", str(layout.blob_path(diff_id)), "-C", str(tree)], check=True)
        trees.append(tree)
    whiteouts = sum(1 for tree in trees for _ in tree.rglob(".wh.*"))
    if whiteouts:
        raise SystemExit(f"import_floor: {whiteouts} whiteouts below the step; the overlay part does not convert them")
    figures["extract_s"] = round(time.monotonic() - started, 1)
    upper, work, root = target / "upper", target / "work", target / "root"
    for directory in (upper, work, root):
        directory.mkdir()
    lower = ":".join(str(tree) for tree in reversed(trees))
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
                    str(root)], check=True)
    try:
        step_env = environment_at(plan, index, data)
        build_started = tree_layer.mark(target)
        step_runner.engine_stubs(root)  # as the build does on a root whose layers had a RUN step
        before = tree_layer.snapshot(upper)
        since = tree_layer.mark(target)
        ran = time.monotonic()
        step_runner.StepRunner(target / "runtime", target).run(
            root, plan.steps[index].argv, dict(item.split("=", 1) for item in step_env), None, None, [],
            what="the step")
        figures["run_s"] = round(time.monotonic() - ran, 1)
        writing = time.monotonic()
        scratch = Layout.create(target / "layout")
        # No view of the layers alone: the byte-compile removes no directory they hold.
        layer, _ = tree_layer.write_step_layer(scratch, root, upper, since, before, int(epoch), drop_stubs=True,
                                               build_started_ns=build_started)
        figures["write_layer_s"] = round(time.monotonic() - writing, 1)
    finally:
        subprocess.run(["umount", str(root)], check=True)
    figures.update(total_s=round(time.monotonic() - started, 1), layer=layer.diff_id, layer_bytes=layer.size,
                   builder_layer=expected, same_layer_as_builder=layer.diff_id == expected)
    return figures


def environment_at(plan: dockerfile_plan.Plan, index: int, config: dict) -> list[str]:
    """The step's environment as the builder's RUN gives it: the build arguments, then the image's
    environment so far (the final one without what ENV steps after the step set)."""
    later = {key for step in plan.steps[index + 1:] if step.keyword == "ENV" for key, _ in step.pairs}
    env = dict(item.split("=", 1) for item in config["config"].get("Env") or [])
    return [f"{k}={v}" for k, v in {**plan.build_args, **{k: v for k, v in env.items() if k not in later}}.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.23-cu130-local")
    parser.add_argument("--scratch", type=Path, default=Path("/var/tmp/import-floor"))
    parser.add_argument("--part", help=argparse.SUPPRESS)  # the child's side of one figure
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    # The child's BUILDER_CACHE is the figure's filesystem: it is told where the host's layout is.
    parser.add_argument("--layout", type=Path, default=cache_root() / "write-once" / "layout", help=argparse.SUPPRESS)
    args = parser.parse_args()
    layout = Layout(args.layout)
    image_id = build_report.read(ROOT / "build-reports" / f"{args.stack}.json").image_id
    if args.part:
        run_part(args.part, args.stack, layout, image_id, args.target)
        return 0
    _, layers = image_layers(layout, image_id)
    image_bytes = sum(layer["size"] for layer in layers)
    bench.become_subreaper()
    figures = {}
    for part in ("read", "import", "extract", "overlay"):
        with bench.loop_filesystem(args.scratch, int(image_bytes * 2.5) + (2 << 30)) as mount:
            env = bench.environment(mount, args.scratch)
            drop_page_cache()
            # The import's hard-linked view of the layout must lie on the layout's own filesystem.
            target = (args.scratch / "view") if part == "import" else mount / "rootfs"
            argv = [sys.executable, str(Path(__file__).resolve()), "--stack", args.stack, "--part", part,
                    "--target", str(target), "--layout", str(layout.root)]
            try:
                run = bench.measured(argv, env, mount)
            finally:
                if part == "import":
                    bench.empty_storage(env)
                    shutil.rmtree(target, ignore_errors=True)
        tail = run.pop("tail")
        run.pop("largest_writes")
        # The overlay part's own figures (its parts, its layer) are the child's last line.
        figures[part] = {**run, **json.loads(tail[-1])} if part == "overlay" else \
            {**run, "mb_per_s": round(image_bytes / run["wall_s"] / 1e6, 1)}
        print(f"{part}: {run['wall_s']} s, {run['bytes_written']} bytes written", flush=True)
    version = subprocess.run(["buildah", "--version"], capture_output=True, text=True, check=True).stdout.split()[2]
    document = {"stack": args.stack, "image_id": image_id, "image_bytes": image_bytes, "layers": len(layers),
                "engine": f"buildah {version}", "measured": time.strftime("%Y-%m-%d", time.gmtime()),
                "cores": os.cpu_count(), **figures,
                "import_over_extract": round(figures["import"]["wall_s"] / figures["extract"]["wall_s"], 2),
                "import_over_overlay": round(figures["import"]["wall_s"] / figures["overlay"]["wall_s"], 2)}
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
