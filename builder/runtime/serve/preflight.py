"""Checks before the server starts: GPUs, driver, model paths, port, cache directory.

A TP-8 load takes minutes before it fails on a missing mount or a busy port;
these checks fail in a second instead, each with one line saying what to fix.
The GPU probes are injectable so the checks run on machines without GPUs.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket

from builder.runtime import driver
from builder.runtime.driver import run_nvidia_smi
from builder.runtime.serve.errors import PreflightError

PROC_GPUS_DIR = "/proc/driver/nvidia/gpus"


@dataclasses.dataclass(frozen=True)
class GpuInventory:
    """GPUs the driver shows this container, and how we found out."""

    names: tuple[str, ...] | None  # None: no probe worked
    source: str  # "nvidia-smi", "/proc/driver/nvidia/gpus" or why neither worked


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    pid: str
    name: str
    used_memory: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name}, {self.used_memory})"


def probe_gpus(run=run_nvidia_smi, proc_dir: str = PROC_GPUS_DIR) -> GpuInventory:
    """nvidia-smi first; the driver's /proc listing when nvidia-smi is absent or fails."""
    result = run(["--query-gpu=index,name", "--format=csv,noheader"])
    smi_problem = "nvidia-smi not found"
    if result is not None:
        if result.returncode == 0:
            names = tuple(
                line.split(",", 1)[1].strip() if "," in line else line.strip()
                for line in result.stdout.splitlines()
                if line.strip()
            )
            return GpuInventory(names, "nvidia-smi")
        first = (result.stdout + result.stderr).strip().splitlines()
        smi_problem = f"nvidia-smi failed: {first[0] if first else 'exit ' + str(result.returncode)}"
    try:
        entries = sorted(os.listdir(proc_dir))
    except OSError:
        return GpuInventory(None, f"{smi_problem}; {proc_dir} absent")
    return GpuInventory(tuple(_proc_gpu_model(os.path.join(proc_dir, e)) for e in entries), proc_dir)


def _proc_gpu_model(gpu_dir: str) -> str:
    try:
        with open(os.path.join(gpu_dir, "information"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown GPU"


def visible_gpu_count(physical: int, cuda_visible_devices: str | None) -> int:
    """GPUs CUDA will use: CUDA_VISIBLE_DEVICES narrows the physical ones.

    CUDA reads the list up to the first entry it cannot use, so "0,1,-1,2" is two GPUs.
    """
    if cuda_visible_devices is None:
        return physical
    count = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            count += 1
        elif entry.isdigit() and int(entry) < physical:
            count += 1
        else:
            break
    return min(count, physical)


def check_gpus(needed: int, inventory: GpuInventory, cuda_visible_devices: str | None) -> None:
    if inventory.names is None:
        raise PreflightError(
            f"no NVIDIA GPU visible ({inventory.source}); start the container with --gpus all"
        )
    visible = visible_gpu_count(len(inventory.names), cuda_visible_devices)
    if visible < needed:
        narrowed = (
            f", CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}" if cuda_visible_devices is not None else ""
        )
        raise PreflightError(
            f"tensor parallel needs {needed} GPUs but {visible} are visible "
            f"({inventory.source}: {len(inventory.names)}{narrowed}); "
            "pass --gpus all, or lower --tp"
        )


def gpu_processes(run=run_nvidia_smi) -> list[GpuProcess]:
    """Processes holding GPU memory (stale servers block a restart); empty when unknown."""
    result = run(["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"])
    if result is None or result.returncode != 0:
        return []
    processes = []
    for line in result.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) >= 3 and fields[0]:
            processes.append(GpuProcess(fields[0], ", ".join(fields[1:-1]), fields[-1]))
    return processes


def check_readable(path: str, what: str) -> None:
    """A model directory (or single-file checkpoint) the server can read."""
    if not os.path.exists(path):
        raise PreflightError(f"{what} {path} does not exist; mount it into the container (-v)")
    try:
        if os.path.isdir(path):
            names = os.listdir(path)
            if "config.json" in names:
                with open(os.path.join(path, "config.json"), "rb") as handle:
                    handle.read(1)
        else:
            with open(path, "rb") as handle:
                handle.read(1)
    except OSError as error:
        raise PreflightError(f"{what} {path} is not readable: {error.strerror}") from None


def check_port_free(host: str, port: int) -> None:
    """Bind the port as the server will; SO_REUSEADDR as uvicorn does, so TIME_WAIT is no conflict."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise PreflightError(f"cannot resolve --host {host}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PreflightError(
                    f"port {port} on {host} is already in use (an earlier server still running?)"
                ) from None
            raise PreflightError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def prepare_cache_dir(cache_dir: str) -> list[str]:
    """Create the cache directory; warn when it is not a mounted volume (lost with the container)."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        probe = os.path.join(cache_dir, ".entrypoint-write-test")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.unlink(probe)
    except OSError as error:
        # The image runs as a fixed non-root uid: a host directory mounted here must be writable by it.
        uid, gid = os.getuid(), os.getgid()
        raise PreflightError(
            f"cache directory {cache_dir} is not writable by uid {uid}: {error.strerror} "
            f"(on the host: chown {uid}:{gid} the mounted directory, or run with --user)"
        ) from None
    if not _on_own_mount(cache_dir):
        return [
            f"{cache_dir} is not a mounted volume: JIT caches will be rebuilt on every container "
            f"start; mount one with -v /somewhere:{cache_dir}"
        ]
    return []


def _on_own_mount(path: str) -> bool:
    """True when path or one of its parents below / is a mount point."""
    path = os.path.realpath(path)
    while path != os.path.dirname(path):
        if os.path.ismount(path):
            return True
        path = os.path.dirname(path)
    return False


@dataclasses.dataclass(frozen=True)
class PreflightReport:
    gpu_names: tuple[str, ...]
    busy: tuple[GpuProcess, ...]
    warnings: tuple[str, ...]
    problems: tuple[str, ...]  # each one a reason not to start


def check_driver(requirement: dict, inventory: GpuInventory, run, proc_version: str) -> list[str]:
    """Refuse a driver older than the stack's CUDA needs; a warning when GPUs show but the version does not."""
    if inventory.names is None:
        return []  # check_gpus names that problem
    installed = driver.installed_version(run, proc_version)
    if installed is None:
        return [f"the NVIDIA driver's version is unknown; not checked against {requirement['minimum']}, "
                f"the minimum for CUDA {requirement['cuda']}"]
    problem = driver.too_old(installed, requirement)
    if problem:
        raise PreflightError(problem)
    return []


def run_preflight(plan, environ: dict, driver_requirement: dict, run=run_nvidia_smi,
                  proc_dir: str = PROC_GPUS_DIR, proc_version: str = driver.PROC_VERSION) -> PreflightReport:
    """Every check, so one run names every problem rather than the first.

    `driver_requirement` is stack.json's "driver": the minimum for the stack's CUDA."""
    problems: list[str] = []
    warnings: list[str] = []
    inventory = probe_gpus(run, proc_dir)
    checks = [
        lambda: check_gpus(plan.gpus_needed, inventory, environ.get("CUDA_VISIBLE_DEVICES")),
        lambda: warnings.extend(check_driver(driver_requirement, inventory, run, proc_version)),
        lambda: check_readable(plan.model, "model path"),
        lambda: check_port_free(plan.host, plan.port),
        lambda: warnings.extend(prepare_cache_dir(plan.cache_dir)),
    ]
    if plan.draft_model:
        checks.insert(2, lambda: check_readable(plan.draft_model, "draft model path"))
    for check in checks:
        try:
            check()
        except PreflightError as error:
            problems.append(str(error))
    busy = tuple(gpu_processes(run)) if inventory.source == "nvidia-smi" else ()
    if busy:
        warnings.append(
            "GPU memory is held by other processes: "
            + ", ".join(process.describe() for process in busy)
            + " (stale servers must be stopped before a restart)"
        )
    return PreflightReport(inventory.names or (), busy, tuple(warnings), tuple(problems))
