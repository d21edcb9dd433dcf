"""What one layer costs the engine: a RUN step writing 1 GiB, built by `buildah build` on a loop-mounted
filesystem of its own (bench/cold_path.py's machinery), its process tree's write_bytes and the disk peak.

    python bench/layer_cost.py [--gib 1] [--scratch /var/tmp/layer-cost]

Needs root and the local base (`builder base`). Writes bench/results/layer-cost.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "layer-cost.json"
BASE = "localhost/builder-base:debian-bookworm"


def cold_path():
    spec = importlib.util.spec_from_file_location("cold_path", ROOT / "bench" / "cold_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--scratch", type=Path, default=Path("/var/tmp/layer-cost"))
    args = parser.parse_args()
    bench = cold_path()
    bench.become_subreaper()
    layer = int(args.gib * 2**30)
    args.scratch.mkdir(parents=True, exist_ok=True)
    base, context = args.scratch / "base.tar", args.scratch / "context"
    base.unlink(missing_ok=True)
    subprocess.run(["buildah", "push", "--quiet", BASE, f"docker-archive:{base}"], check=True)
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text(
        f'FROM {BASE}\nRUN ["/bin/sh", "-c", "head -c {layer} /dev/urandom > /big"]\n')
    try:
        with bench.loop_filesystem(args.scratch, layer * 6 + 2**30) as mount:
            env = bench.environment(mount, args.scratch)
            os.environ["TMPDIR"] = env["TMPDIR"]
            bench.load_base(base, env)
            run = bench.measured(["buildah", "build", "--layers", "--pull=never", "--network", "none", "--format",
                                  "oci", "--tag", "localhost/layer-cost:probe", str(context)], env, mount)
            bench.empty_storage(env)
    finally:
        base.unlink(missing_ok=True)
    run.pop("tail")
    version = subprocess.run(["buildah", "--version"], capture_output=True, text=True, check=True).stdout.split()[2]
    document = {"layer_bytes": layer, "engine": "buildah", "engine_version": version, "measured": time.strftime("%Y-%m-%d", time.gmtime()),
                **run, "bytes_written_over_layer": round(run["bytes_written"] / layer, 3),
                "peak_disk_over_layer": round(run["peak_disk_bytes"] / layer, 3)}
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(json.dumps({key: document[key] for key in ("bytes_written_over_layer", "peak_disk_over_layer")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
