"""The cold path: whole `builder build` runs from nothing, on a filesystem of their own.

    python bench/cold_path.py [--stack sglang-0.5.9-cu128-local] [--size-gib 40] [--runs 1]

Each run gets a fresh loop-mounted ext4 filesystem of --size-gib (a sparse file under --scratch) that
holds everything the build writes: buildah's storage (through CONTAINERS_STORAGE_CONF, which buildah
and podman both read), the wheel cache (BUILDER_CACHE), the build context and the temporary files
(TMPDIR). So its used blocks, sampled twice a second, are the build's disk use, whatever else the
machine does, and a build that needs more than the cap fails as it would on a runner of that size.

  cold          empty storage, empty wheel cache: `builder build --local-base --stack S` as the README runs it
  noop          the same build again, nothing changed
  patch_change  one line added to the last patch file's header, then the build again (smoke checks included;
                none kept yet on this host: the runs committed beside the build report answer every check
                that read nothing the change touched, as on a user's fresh clone)
  patch_change_again  another line instead, right after: the edit loop, where the checks that read
                nothing the change touched are answered by the kept results (docs/smoke.md)

Every figure starts from the committed lock. Where it records a smoke pass for the image id the build
gives (cold, noop and second_cold on a current lock), the build skips the checks as it does for a user;
the patch change makes a new id, so its checks run.
  second_cold   the storage and the layer cache emptied again, the wheel cache kept
  bare_engine   `buildah build` alone of the same Dockerfile and context, empty storage, wheels in place;
                its image's canonical form is compared with the builder's (engine_path)

peak_memory_staging_bytes is the peak of the memory filesystem's use over its start: where the builder
stages an import's layers when they fit (builder/engine/staging.py; a build imports nothing since the
layout became the image's home, so 0), in neither peak_disk_bytes nor bytes_written.
bytes_written is the I/O accounting (write_bytes) of the build's whole process tree: this process is
its subreaper, so every descendant's writes (buildah, runc, pip, podman, conmon) are added to ours
when it is reaped. The breakdown splits them at the engine's output lines (each step; its install's
end; the commit after it). docker_copy_bytes is what the build copied into the Docker daemon.
Writes bench/results/cold-path.json.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.build_stack import build, context  # noqa: E402
from builder.cache import wheel_cache  # noqa: E402
from builder.config.matrix import load_matrix  # noqa: E402
from builder.engine import staging  # noqa: E402
from builder.engine.buildah import BuildahEngine  # noqa: E402
from builder.engine.progress import Progress  # noqa: E402
from builder.lock import build_report  # noqa: E402
from builder.lock.resolution import base_pin, check_current  # noqa: E402
from builder.paths import Project  # noqa: E402
from builder.render import render  # noqa: E402
from build_cache import one_line_added  # noqa: E402  (bench/, the script's own folder)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cold-path.json"
PR_SET_CHILD_SUBREAPER = 36
TARGETS = {"cold_over_bare_engine": 0.60, "second_cold_over_cold": 0.50, "peak_disk_over_image_and_wheels": 1.25,
           "bytes_written_over_image": 3.0, "docker_copy_bytes": 0, "noop_over_cold": 0.01,
           "patch_change_over_cold": 0.05}
# Where the output starts a new part of the work: the engine's step, an install's end (its commit follows),
# a commit; the write-once build's written layer; the smoke checks.
_MARK = re.compile(r"(STEP \d+/\d+: .{0,60}|Successfully installed|COMMIT\b.*|--> .*|layer \d+: .{0,40}|"
                   r"smoke checks in .{0,20})")


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans() -> None:
    """Wait for descendants that outlived their parents, so their writes count as ours."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def written(pid: int | str = "self") -> int:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return int(re.search(r"^write_bytes: (\d+)$", text, re.M)[1])


def tree_written(root: int) -> int:
    """write_bytes of `root` and its live descendants (each already holds its reaped children's)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(written(pid) for pid in tree)


@contextlib.contextmanager
def loop_filesystem(scratch: Path, size_bytes: int) -> Iterator[Path]:
    """A fresh ext4 filesystem of size_bytes (sparse backing file), mounted; removed afterwards."""
    scratch.mkdir(parents=True, exist_ok=True)
    backing, mount = scratch / "fs.img", scratch / "fs"
    with backing.open("wb") as handle:
        handle.truncate(size_bytes)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(backing)], check=True)
    mount.mkdir(exist_ok=True)
    # discard: blocks freed inside (a commit's temporary layer blob) go back to the host at once, so the
    # backing file holds what the filesystem holds, not everything it ever wrote.
    subprocess.run(["mount", "-o", "loop,discard", str(backing), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--recursive", "--lazy", str(mount)], check=False)
        backing.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mount.rmdir()


def used_bytes(mount: Path) -> int:
    stat = os.statvfs(mount)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


class PeakDisk:
    """The filesystem's used bytes, sampled twice a second; the peak over what was used at start."""

    def __init__(self, mount: Path):
        self.mount, self.baseline, self.peak = mount, used_bytes(mount), 0
        self.temporary = Path(os.environ.get("TMPDIR", mount))
        self.temporary_peak = 0
        # The builder stages an import's layers on the memory filesystem when they fit (staging.py).
        self.memory_baseline, self.memory_peak = used_bytes(staging.MEMORY_FS), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, used_bytes(self.mount) - self.baseline)
            if not self.temporary.is_relative_to(self.mount):
                self.temporary_peak = max(self.temporary_peak, used_bytes(self.temporary))
            self.memory_peak = max(self.memory_peak, used_bytes(staging.MEMORY_FS) - self.memory_baseline)

    def __enter__(self) -> PeakDisk:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, used_bytes(self.mount) - self.baseline)


def environment(mount: Path, scratch: Path, tmpdir: Path | None = None) -> dict[str, str]:
    """Storage, caches and temporary files on the filesystem (temporary files in `tmpdir` when given);
    the runroot on /run (podman wants it short)."""
    runroot = Path("/run") / f"coldpath-{os.getpid()}"
    conf = scratch / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{mount / "storage"}"\nrunroot = "{runroot}"\n')
    (mount / "tmp").mkdir(exist_ok=True)
    # Python caches the builder's bytecode as it does by default (the host running the bench may say
    # otherwise): a user's second run does not compile the builder's modules again.
    inherited = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**inherited, "CONTAINERS_STORAGE_CONF": str(conf), "BUILDER_CACHE": str(mount / "cache"),
            "TMPDIR": str(tmpdir or mount / "tmp"), "CI": "true"}


@contextlib.contextmanager
def memory_tmpdir(scratch: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs for TMPDIR: buildah's and containers/image's staging copies of each layer go to memory."""
    path = scratch / "tmpfs"
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


def load_base(archive: Path, env: dict[str, str]) -> None:
    """The local base (saved from the default storage) into the run's storage: not timed, not counted."""
    subprocess.run(["buildah", "pull", "--quiet", f"docker-archive:{archive}"], env=env, check=True,
                   capture_output=True)


def empty_storage(env: dict[str, str]) -> None:
    for argv in (["buildah", "rm", "--all"], ["buildah", "rmi", "--all", "--force"]):
        subprocess.run(argv, env=env, check=True, capture_output=True)


def measured(argv: list[str], env: dict[str, str], mount: Path) -> dict:
    """Run argv to the end; its wall time, the bytes its process tree wrote (and where), the disk peak."""
    reap_orphans()
    before = written()
    parts: list[dict] = []
    with PeakDisk(mount) as disk:
        started = time.monotonic()
        process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace")
        mark, at_mark, at_time = "start", 0, started
        tail: list[str] = []
        for line in process.stdout:
            sys.stdout.write(line)
            tail = (tail + [line])[-20:]
            found = _MARK.search(line)
            if found:
                now = tree_written(process.pid)
                parts.append({"part": mark, "bytes": now - at_mark, "s": round(time.monotonic() - at_time, 1)})
                mark, at_mark, at_time = found[1][:80], now, time.monotonic()
        returncode = process.wait()
        wall = time.monotonic() - started
        reap_orphans()
    total = written() - before
    parts.append({"part": mark, "bytes": total - at_mark, "s": round(time.monotonic() - at_time, 1)})
    if returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed (exit {returncode}):\n{''.join(tail)}")
    return {"wall_s": round(wall, 1), "bytes_written": total, "peak_disk_bytes": disk.peak, "tail": tail,
            "peak_memory_tmpdir_bytes": disk.temporary_peak, "peak_memory_staging_bytes": disk.memory_peak,
            "largest_writes": sorted((p for p in parts if p["bytes"] > 50_000_000), key=lambda p: -p["bytes"])}


def builder_build(stack_name: str, env: dict[str, str], mount: Path) -> dict:
    row = stack_name.removesuffix("-local")
    argv = [sys.executable, "-m", "builder.cli", "build", "--stack", row]
    argv += ["--local-base"] if row != stack_name else []
    run = measured(argv, env, mount)
    report = build_report.read(ROOT / "build-reports" / f"{stack_name}.json")
    provenance = json.loads((ROOT / "build-reports" / f"{stack_name}.provenance.json").read_text())
    external = provenance["predicate"]["buildDefinition"]["externalParameters"]
    return {**run, "image_id": report.image_id, "image_bytes": report.image_bytes,
            "docker_copy_bytes": external["delivered_bytes"], "wheel_bytes_downloaded": external["wheel_bytes_downloaded"]}


def patch_change(stack, env: dict[str, str], mount: Path, line: bytes) -> dict:
    patch = ROOT / render.rendered_patches(stack, ROOT / "patches")[-1].source
    with one_line_added(patch, line):
        return builder_build(stack.name, env, mount)


def bare_engine(stack, env: dict[str, str], mount: Path) -> dict:
    """`buildah build` alone, with the context (wheels hard-linked from the cache) made beforehand; then
    (not timed) its image in canonical form, whose id is the builder's when both hold the same files."""
    resolution = check_current(stack, Project(ROOT).lock).resolution
    inputs = context.build_inputs(stack, ROOT, base_pin(stack, resolution))
    cache = wheel_cache.WheelCache(Path(env["BUILDER_CACHE"]) / "locked-wheels")
    context_dir = mount / "tmp" / "bare-context"
    dockerfile = build.stage_context(inputs, ROOT, resolution, cache, context_dir)
    request = build.build_request(stack, context_dir, dockerfile, "localhost/bench-bare:latest", False,
                                  Progress.for_environment())
    engine = BuildahEngine(export_to_docker=False)
    argv = engine.build_command(request, mount / "tmp" / "iid")
    run = measured(argv, env, mount)
    native_id = (mount / "tmp" / "iid").read_text().strip()
    native_id = native_id if native_id.startswith("sha256:") else f"sha256:{native_id}"
    run["engine_image_id"] = engine.canonical_preview(native_id, request).image_id
    shutil.rmtree(context_dir)
    return run


def figure(values: list) -> object:
    if len(values) == 1:
        return values[0]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_results(stack, args, runs: dict[str, list[dict]], wheel_bytes: list[int]) -> dict:
    """The document from what has been measured so far: a figure not measured (yet) is null."""
    def of(name: str, key: str = "wall_s"):
        return figure([run[key] for run in runs[name]]) if runs[name] else None

    median = lambda value: value["median"] if isinstance(value, dict) else value  # noqa: E731
    document = {
        "stack": stack.name, "engine": "buildah", "runs": args.runs, "filesystem_cap_bytes": int(args.size_gib * 2**30),
        "tmpdir": f"tmpfs of {args.tmpfs_gib} GiB (not in peak_disk_bytes or bytes_written; see "
                  "peak_memory_tmpdir_bytes)" if args.tmpfs_gib else "on the filesystem",
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "cold_s": of("cold"), "bare_engine_s": of("bare_engine"), "second_cold_s": of("second_cold"),
        "noop_s": of("noop"), "patch_change_s": of("patch_change"),
        "patch_change_again_s": of("patch_change_again"),
        "image_bytes": of("cold", "image_bytes"), "wheel_bytes": figure(wheel_bytes) if wheel_bytes else None,
        "peak_disk_bytes": of("cold", "peak_disk_bytes"), "bytes_written": of("cold", "bytes_written"),
        "peak_memory_staging_bytes": of("cold", "peak_memory_staging_bytes"),
        "docker_copy_bytes": of("cold", "docker_copy_bytes"),
        "runs_detail": {name: [{k: v for k, v in run.items() if k != "tail"} for run in found]
                        for name, found in runs.items()},
        "targets": TARGETS,
    }
    if runs["bare_engine"] and runs["cold"]:
        engine_id = runs["bare_engine"][-1]["engine_image_id"]
        document["engine_path"] = {"engine": f"buildah {BuildahEngine(export_to_docker=False).version()}",
                                   "image_id": engine_id,
                                   "same_files_as_builder": engine_id == runs["cold"][-1]["image_id"]}
    ratios = {}
    for name in ("noop", "patch_change", "patch_change_again"):
        if document["cold_s"] is not None and document[f"{name}_s"] is not None:
            ratios[f"{name}_over_cold"] = median(document[f"{name}_s"]) / median(document["cold_s"])
    if document["cold_s"] is not None and document["bare_engine_s"] is not None:
        ratios["cold_over_bare_engine"] = median(document["cold_s"]) / median(document["bare_engine_s"])
    if document["cold_s"] is not None and document["second_cold_s"] is not None:
        ratios["second_cold_over_cold"] = median(document["second_cold_s"]) / median(document["cold_s"])
    if document["cold_s"] is not None:
        image = median(document["image_bytes"])
        ratios["peak_disk_over_image_and_wheels"] = median(document["peak_disk_bytes"]) / (
            image + median(document["wheel_bytes"]))
        ratios["bytes_written_over_image"] = median(document["bytes_written"]) / image
        ratios["docker_copy_bytes"] = median(document["docker_copy_bytes"])
    document["ratios"] = {name: round(value, 3) for name, value in ratios.items()}
    document["met"] = {name: ratios[name] <= target for name, target in TARGETS.items() if name in ratios}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return document


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="sglang-0.5.9-cu128-local")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--size-gib", type=float, default=40.0, help="the filesystem's size (the cap)")
    parser.add_argument("--scratch", type=Path, default=Path("/var/tmp/coldpath-bench"))
    parser.add_argument("--tmpfs-gib", type=float, default=0,
                        help="TMPDIR on a tmpfs of this size (0: on the filesystem): the engine's staging copies in memory")
    parser.add_argument("--figures", default="cold,noop,patch_change,patch_change_again,second_cold,bare_engine",
                        help="which to measure, in this order (noop and patch_change need cold's storage, "
                             "second_cold its wheel cache)")
    args = parser.parse_args()
    figures = args.figures.split(",")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount and restore on the way out
    become_subreaper()
    args.scratch.mkdir(parents=True, exist_ok=True)
    os.environ["BUILDER_LOCK"] = str(args.scratch / "matrix.lock")  # the committed lock, copied per figure
    stack = load_matrix(ROOT / "matrix.toml", local_base=True).stack(args.stack)
    reports = {p: p.read_bytes() for p in (ROOT / "build-reports").glob(f"{stack.name}.*")}
    runs: dict[str, list[dict]] = {name: [] for name in ("cold", "noop", "patch_change", "patch_change_again",
                                                         "second_cold", "bare_engine")}
    base = args.scratch / "base.tar"
    base.unlink(missing_ok=True)
    BuildahEngine(export_to_docker=False).save(stack.base.image, base)
    wheel_bytes: list[int] = []
    try:
        for _ in range(args.runs):
            with contextlib.ExitStack() as stack_of_mounts:
                mount = stack_of_mounts.enter_context(loop_filesystem(args.scratch, int(args.size_gib * 2**30)))
                tmpdir = (stack_of_mounts.enter_context(memory_tmpdir(args.scratch, int(args.tmpfs_gib * 2**30)))
                          if args.tmpfs_gib else None)
                env = environment(mount, args.scratch, tmpdir)
                os.environ.update({key: env[key] for key in ("CONTAINERS_STORAGE_CONF", "BUILDER_CACHE", "TMPDIR")})
                for name in figures:
                    # Each figure starts from the committed lock, as a user's clone does: a build records
                    # its smoke result there, and a later figure must not find (or lack) it because of that.
                    shutil.copy(ROOT / "matrix.lock", os.environ["BUILDER_LOCK"])
                    if name in ("cold", "second_cold", "bare_engine"):
                        empty_storage(env)
                        # A cold build has no layer cache, layout or listings either: they live with the
                        # wheels in BUILDER_CACHE, and only the wheels are kept (for second_cold).
                        for kept in (mount / "cache").glob("*"):
                            if kept.name != "locked-wheels":
                                shutil.rmtree(kept, ignore_errors=True) if kept.is_dir() else kept.unlink()
                        load_base(base, env)
                    if name == "bare_engine":
                        runs[name].append(bare_engine(stack, env, mount))
                    elif name == "patch_change":
                        runs[name].append(patch_change(stack, env, mount, b"bench: a one-line change to the patch's header\n"))
                    elif name == "patch_change_again":
                        runs[name].append(patch_change(stack, env, mount, b"bench: another one-line change\n"))
                    else:
                        runs[name].append(builder_build(stack.name, env, mount))
                    if name == "cold":
                        wheel_bytes.append(sum(f.stat().st_size for f in (mount / "cache" / "locked-wheels").rglob("*")
                                               if f.is_file()))
                    write_results(stack, args, runs, wheel_bytes)
    finally:
        for path, data in reports.items():
            path.write_bytes(data)
        base.unlink(missing_ok=True)
    document = write_results(stack, args, runs, wheel_bytes)
    print(json.dumps({key: document[key] for key in ("ratios", "met")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
