"""What writing one wheel as its own layer costs (builder/oci/wheel_layer.py): the torch 2.9.1 wheel of
the cu128 row (pip's default index), checked against the lock, unpacked into the venv's scheme and
written once, canonical, into an OCI layout. Seconds, the bytes this process wrote (/proc/self/io), the
layer's size; beside the engine's figures for a layer (bench/results/layer-cost.json) and for the
install step that holds torch in the cold path (bench/results/cold-path.json).

    python bench/wheel_layer.py [--cache DIR] [--scratch /var/tmp/wheel-layer]

Downloads the wheel once into --cache (`pip download --no-deps`). Writes bench/results/wheel-layer.json.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.oci.layout import Layout  # noqa: E402
from builder.oci.wheel_layer import LockedWheel, VenvScheme, write_wheel_layer  # noqa: E402
from builder.paths import cache_root  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "wheel-layer.json"
STACK = "sglang-0.5.9-cu128-local"
WHEEL = "torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl"
EPOCH = 1_700_000_000


def locked_sha256(wheel: str) -> str:
    """The sha256 the lock's cu128 row records for `wheel`."""
    lock = json.loads((ROOT / "matrix.lock").read_text())
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if value.get("wheel") == wheel and isinstance(value.get("sha256"), str):
                found.append(value["sha256"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(lock["stacks"][STACK])
    if len(set(found)) != 1:
        raise SystemExit(f"matrix.lock: {STACK} records {len(set(found))} sha256 values for {wheel}")
    return found[0]


def io_counters() -> dict[str, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {key: int(value) for key, value in fields.items()}


def engine_figures() -> dict:
    """The engine's figures this is compared with, as the committed results record them."""
    layer_cost = json.loads((ROOT / "bench" / "results" / "layer-cost.json").read_text())
    cold = json.loads((ROOT / "bench" / "results" / "cold-path.json").read_text())
    bare = cold["runs_detail"]["bare_engine"][0]["largest_writes"]
    # cold_path.py splits the writes at the engine's output: the largest "STEP n: RUN" part is the torch
    # group's install step with buildah's commit after it (the image's tool prints no line between them).
    step = max((part for part in bare if part["part"].startswith("STEP")), key=lambda p: p["bytes"])
    return {
        "layer_cost": {"what": "buildah 1.28.2, one RUN step writing 1 GiB (bench/layer_cost.py)",
                       "bytes_written_over_layer": layer_cost["bytes_written_over_layer"],
                       "wall_s": layer_cost["wall_s"], "layer_bytes": layer_cost["layer_bytes"]},
        "cold_path_torch_group": {
            "what": "the bare engine build's largest step (the torch group's install, then buildah's commit), "
                    "from bench/results/cold-path.json",
            "step_bytes_written": step["bytes"], "step_s": step["s"]},
        "cold_path_image": {"bytes_written_over_image": cold["ratios"]["bytes_written_over_image"],
                            "image_bytes": cold["image_bytes"]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=cache_root() / "bench-wheels")
    parser.add_argument("--scratch", type=Path, default=Path("/var/tmp/wheel-layer"))
    args = parser.parse_args()
    wheel = args.cache / WHEEL
    if not wheel.is_file():
        args.cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--dest",
                        str(args.cache), "torch==2.9.1"], check=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    layout = Layout.create(args.scratch / "layout")
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    load = os.getloadavg()[0]
    try:
        before, clock, cpu = io_counters(), time.monotonic(), time.process_time()
        written = write_wheel_layer(layout, [LockedWheel(wheel, locked_sha256(WHEEL))], scheme, EPOCH)
        wall, cpu, after = time.monotonic() - clock, time.process_time() - cpu, io_counters()
        stored = sum(path.stat().st_size for path in layout.blobs.iterdir())
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    bytes_written = after["write_bytes"] - before["write_bytes"]
    document = {
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "load_average_1m_at_start": round(load, 2)},
        "wheel": WHEEL, "wheel_bytes": wheel.stat().st_size, "stack": STACK,
        "layer": {"diff_id": written.diff_id, "bytes": written.size, "files": sum(kind == "file" for _, kind, _ in written.listing)},
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "bytes_written": bytes_written, "bytes_read": after["read_bytes"] - before["read_bytes"],
        "bytes_written_over_layer": round(bytes_written / written.size, 3),
        "layout_bytes": stored,
        "engine": engine_figures(),
    }
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
