"""The README's first command as a new user runs it: `scripts/build-default` in a fresh clone.

    python bench/first_command.py [--scratch /var/tmp/first-command-bench] [--keep]

A clone of HEAD under --scratch, with its own buildah storage, builder cache and temporary files there
(cold_path.environment: nothing of the builder's cached), pip's cache off and PYTHONDONTWRITEBYTECODE
unset, as on a plain Debian. The host's packages and mkfs.erofs are as the host has them:
`mkfs_erofs_built` says whether the run's set-up had to build it.

Records the wall time; the CPU time of the whole process tree (this process is its subreaper, so the
steps' compilers count when reaped); `cpu_floor_s`, that CPU time over the host's CPUs, under which no
schedule of the same work can end; the build's own time (`builder build`, by its clock) and the
FlashInfer bake's step within it; and whether the image id is the lock's and the clone stays clean.
Writes bench/results/first-command.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.lock import store  # noqa: E402
from cold_path import PeakDisk, become_subreaper, empty_storage, environment, reap_orphans  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "first-command.json"
ROW = "sglang-0.5.23-cu130-local"  # what scripts/build-default builds
_STAMPED = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")  # the builder's own progress lines
_LAYER = re.compile(r"^layer (\d+): ")
_DONE = re.compile(rf"^== {re.escape(ROW)}: \S+ = (sha256:[0-9a-f]{{64}}) \(([\d.]+) s;")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def locked_image_id(clone: Path) -> str | None:
    entry = store.entry(ROW, clone / "matrix.lock")
    return entry.outcome.image.image_id if entry and entry.outcome.image else None


def bake_layer_index(clone: Path) -> int:
    """1-based, as the build's `layer N:` lines count."""
    report = json.loads((clone / "build-reports" / f"{ROW}.json").read_text())
    return next(i for i, layer in enumerate(report["layers"], 1) if "flashinfer_bake" in layer["step"])


def run(clone: Path, env: dict[str, str]) -> dict:
    stamps: dict[int, float] = {}
    image_id = build_s = None
    erofs_built = False
    reap_orphans()
    cpu_before = cpu_seconds()
    with PeakDisk(clone.parent) as disk:
        started = time.monotonic()
        process = subprocess.Popen(["scripts/build-default"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace")
        tail: list[str] = []
        for line in process.stdout:
            sys.stdout.write(line)
            tail = (tail + [line])[-20:]
            erofs_built |= line.startswith("erofs-utils: building")
            stamped = _STAMPED.match(line.rstrip("\n"))
            if not stamped:
                continue
            at, text = float(stamped[1]), stamped[2]
            if layer := _LAYER.match(text):
                stamps[int(layer[1])] = at
            if done := _DONE.match(text):
                image_id, build_s = done[1], float(done[2])
        returncode = process.wait()
        wall = time.monotonic() - started
        reap_orphans()
    if returncode != 0:
        raise SystemExit(f"scripts/build-default failed (exit {returncode}):\n{''.join(tail)}")
    bake = bake_layer_index(clone)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    cpu = cpu_seconds() - cpu_before
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "cpus": os.cpu_count(),
            "cpu_floor_s": round(cpu / os.cpu_count(), 1), "build_s": build_s,
            "setup_and_base_s": round(wall - build_s, 1) if build_s is not None else None,
            "bake_s": round(stamps[bake] - stamps[bake - 1], 1) if {bake, bake - 1} <= stamps.keys() else None,
            "image_id": image_id, "peak_disk_bytes": disk.peak, "mkfs_erofs_built": erofs_built,
            "git_status_clean": status.stdout == ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, default=Path("/var/tmp/first-command-bench"))
    parser.add_argument("--keep", action="store_true", help="leave the clone, its storage and cache")
    args = parser.parse_args()
    become_subreaper()
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    clone = args.scratch / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.strip()
    env = {**environment(args.scratch, args.scratch), "PIP_NO_CACHE_DIR": "1"}
    env.pop("CI")  # a user's shell, not CI's
    locked = locked_image_id(clone)
    try:
        measured = run(clone, env)
    finally:
        if not args.keep:
            empty_storage(env)
            shutil.rmtree(args.scratch, ignore_errors=True)
    document = {"commit": commit, "row": ROW, "measured": time.strftime("%Y-%m-%d", time.gmtime()),
                "lock_image_id": locked, "same_as_lock": measured["image_id"] == locked, **measured}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
