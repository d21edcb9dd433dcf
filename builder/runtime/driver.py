"""The host's NVIDIA driver, and whether it is new enough for the stack's CUDA.

stack.json's "driver" holds the minimum driver for the stack's CUDA toolkit and
where that figure comes from (builder/config/compat_data.toml). `serve`, `bench` and
the GPU smoke checks read the driver version and refuse an older one: a CUDA 13
image on a 570-series host fails later and less clearly (cudaErrorInsufficientDriver
in the middle of a TP-8 start).
"""

from __future__ import annotations

import re
import shutil
import subprocess

PROC_VERSION = "/proc/driver/nvidia/version"
NVIDIA_SMI_TIMEOUT_S = 30
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.48.01  ..." (or "Open Kernel Module for x86_64")
_PROC_LINE = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s")
_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")


def run_nvidia_smi(arguments: list[str]) -> subprocess.CompletedProcess | None:
    """nvidia-smi from PATH; None when it is not installed."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        return subprocess.run([binary, *arguments], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess([binary, *arguments], 1, "", str(error))


def installed_version(run=run_nvidia_smi, proc_version: str = PROC_VERSION) -> str | None:
    """The driver version ("590.48.01"): nvidia-smi first, then the kernel module's /proc file;
    None when neither answers."""
    result = run(["--query-gpu=driver_version", "--format=csv,noheader"])
    if result is not None and result.returncode == 0:
        versions = [line.strip() for line in result.stdout.splitlines() if _VERSION.match(line.strip())]
        if versions:
            return versions[0]
    try:
        with open(proc_version, encoding="utf-8", errors="replace") as handle:
            match = _PROC_LINE.search(handle.read())
    except OSError:
        return None
    return match.group(1) if match else None


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def too_old(installed: str, requirement: dict) -> str | None:
    """Why `installed` cannot run the stack, naming both versions; None when it is new enough.

    `requirement` is stack.json's "driver": {"cuda", "minimum", "source"}."""
    if version_key(installed) >= version_key(requirement["minimum"]):
        return None
    return (f"NVIDIA driver {installed} is older than {requirement['minimum']}, the minimum for "
            f"CUDA {requirement['cuda']} ({requirement['source']}); upgrade the host's driver")
