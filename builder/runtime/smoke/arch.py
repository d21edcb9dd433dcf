"""arch: the stack's target GPUs have device code in the kernels it ships.

Device code is read from the ELF files themselves: the `.nv_fatbin` entries of
extension modules and the SM in each cubin's header (see elf.py). Where
cuobjdump is present its listing must agree with that reading.

- arch.sgl-kernel: every `common_ops` library (the op library sgl_kernel loads
  for the running GPU) has SASS or PTX that runs on each target;
- arch.flashinfer: flashinfer's prebuilt device code (flashinfer-cubin's
  cubins and flashinfer-jit-cache's modules) has code for each target.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess

from builder.runtime.binaries import elf
from builder.runtime.smoke import report
from builder.runtime.smoke.env import Environment

FLASHINFER_DEVICE_CODE = ("flashinfer-cubin", "flashinfer-jit-cache")
_CUOBJDUMP_NAME = re.compile(r"\.(sm_\d+[af]?)\.(cubin|ptx)$")


def run(env: Environment) -> list[report.Result]:
    targets = [parse_target(target) for target in env.info["target_arch"]]
    return [_sgl_kernel(env, targets), _flashinfer(env, targets)]


def parse_target(target: str) -> tuple[int, int]:
    """"12.0" -> (12, 0)."""
    major, _, minor = str(target).partition(".")
    return int(major), int(minor or 0)


def target_name(target: tuple[int, int]) -> str:
    return f"sm_{target[0]}{target[1]}"


def device_code_files(env: Environment, distribution: str) -> dict[str, list[elf.DeviceCode]]:
    """{path: device code objects} for every ELF of a distribution that carries any."""
    found: dict[str, list[elf.DeviceCode]] = {}
    for path in env.distribution_files(distribution):
        if not (path.suffix in (".so", ".cubin") or ".so." in path.name):
            continue
        try:
            with elf.ElfFile(str(path)) as obj:
                code = obj.device_code()
        except elf.ElfError:
            continue
        if code:
            found[str(path)] = code
    return found


def summarize(code: list[elf.DeviceCode]) -> str:
    counts = collections.Counter(item.name for item in code)
    return ", ".join(f"{name}" if count == 1 else f"{name}x{count}"
                     for name, count in sorted(counts.items()))


def runnable(code: list[elf.DeviceCode], target: tuple[int, int]) -> list[str]:
    return sorted({item.name for item in code if item.runs_on(*target)})


def _sgl_kernel(env: Environment, targets: list[tuple[int, int]]) -> report.Result:
    check = "arch.sgl-kernel"
    distribution = env.kernel_distribution()
    if not env.in_stack(distribution):
        return report.skipped(check, f"{distribution} is not part of this stack")
    files = device_code_files(env, distribution)
    op_libraries = {path: code for path, code in files.items()
                    if os.path.basename(path).startswith("common_ops")}
    if not op_libraries:
        return report.failed(check, f"{distribution} has no common_ops library with device code")
    problems, evidence = [], []
    for path, code in sorted(op_libraries.items()):
        short = _short(path)
        for target in targets:
            names = runnable(code, target)
            if names:
                evidence.append(f"{target_name(target)}: {'/'.join(names)} in {short}")
            else:
                problems.append(f"{short} has no code for {target_name(target)} "
                                f"(has {summarize(code)})")
    problems += _cuobjdump_disagreements(op_libraries)
    others = [f"{_short(path)} ({summarize(code)})" for path, code in sorted(files.items())
              if path not in op_libraries
              and not all(runnable(code, target) for target in targets)]
    note = f"; without the target (optional kernels): {'; '.join(others)}" if others else ""
    if problems:
        return report.failed(check, "; ".join(problems))
    return report.passed(check, "; ".join(evidence) + note)


def _flashinfer(env: Environment, targets: list[tuple[int, int]]) -> report.Result:
    check = "arch.flashinfer"
    present = [name for name in FLASHINFER_DEVICE_CODE if env.in_stack(name)]
    if not present:
        return report.skipped(check, "neither flashinfer-cubin nor flashinfer-jit-cache is "
                                     "part of this stack")
    code_by_distribution = {}
    for name in present:
        code_by_distribution[name] = [item for code in device_code_files(env, name).values()
                                      for item in code]
    inventory = "; ".join(f"{name}: {summarize(code) or 'no device code'}"
                          for name, code in code_by_distribution.items())
    everything = [item for code in code_by_distribution.values() for item in code]
    absent = [target_name(target) for target in targets if not runnable(everything, target)]
    jit_reason = env.info.get("jit_device_code", {}).get("flashinfer")
    if absent and jit_reason:
        # Declared in the matrix: compiled on first start, so its absence is known, not a fault.
        return report.skipped(check, f"no prebuilt device code for {', '.join(absent)} ({inventory}); "
                                     f"declared JIT: {jit_reason}")
    if absent:
        return report.failed(check, f"no prebuilt device code for {', '.join(absent)} "
                                    f"({inventory})")
    return report.passed(check, inventory)


def cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = os.path.join(cuda_home, "bin", "cuobjdump")
    return candidate if os.access(candidate, os.X_OK) else None


def cuobjdump_names(tool: str, path: str) -> collections.Counter:
    """Device-code names cuobjdump lists for a file: sm_XX for SASS, compute_XX for PTX."""
    names: collections.Counter = collections.Counter()
    for option in ("--list-elf", "--list-ptx"):
        done = subprocess.run([tool, option, path], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            match = _CUOBJDUMP_NAME.search(line.strip())
            if match:
                arch, kind = match.groups()
                # An "f" (family) cubin carries no distinct bit in its header:
                # elf.py reports it as the plain SM, and so does this comparison.
                arch = arch.rstrip("f")
                names[arch if kind == "cubin" else arch.replace("sm_", "compute_")] += 1
    return names


def _cuobjdump_disagreements(files: dict[str, list[elf.DeviceCode]]) -> list[str]:
    tool = cuobjdump()
    if tool is None:
        return []
    problems = []
    for path, code in sorted(files.items()):
        ours = collections.Counter(item.name for item in code)
        theirs = cuobjdump_names(tool, path)
        if theirs and ours != theirs:
            problems.append(f"cuobjdump lists {dict(sorted(theirs.items()))} in {_short(path)}, "
                            f"the fatbin reader {dict(sorted(ours.items()))}")
    return problems


def _short(path: str) -> str:
    parts = path.split("/site-packages/", 1)
    return parts[1] if len(parts) == 2 else path
