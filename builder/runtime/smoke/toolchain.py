"""compile: the image compiles device code for its target GPUs, no GPU needed.

Applies to stacks that pin the nvidia-cuda-nvcc wheel (the CUDA 13 rows: FlashInfer JIT-compiles its
sm_120 kernels with it); a stack without it is skipped, saying so.

- compile.nvcc: the wheel's nvcc is the CUDA runtime's release (major.minor of torch.version.cuda:
  compat_data.toml [nvcc_runtime_minor] says why) and compiles a small kernel to a cubin for each
  target, whose ELF header must name that SM;
- compile.flashinfer-jit: FlashInfer's own JIT builds its PCIe IPC all-reduce module (what the pcie-ar
  serve mode loads) for the targets (FLASHINFER_CUDA_ARCH_LIST), into a scratch workspace; the
  library it links must carry SASS for each target.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import textwrap
from pathlib import Path

from builder.runtime import cuda_home
from builder.runtime.binaries import elf
from builder.runtime.smoke import report
from builder.runtime.smoke.arch import parse_target, target_name
from builder.runtime.smoke.env import Environment, run_python

NVCC_DISTRIBUTION = "nvidia-cuda-nvcc"
NVCC_TIMEOUT_S = 300
JIT_TIMEOUT_S = 1500
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
KERNEL = "__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n"

# Run in a child interpreter: FlashInfer reads its environment when imported.
_JIT_BUILD = textwrap.dedent("""
    import sys
    from flashinfer.jit import comm
    spec = comm.gen_pcie_ipc_comm_module()
    spec.build()
    print(spec.get_library_path())
""")


def run(env: Environment) -> list[report.Result]:
    if not env.in_stack(NVCC_DISTRIBUTION):
        reason = f"the stack pins no {NVCC_DISTRIBUTION}: its image carries no compiler to check"
        return [report.skipped("compile.nvcc", reason), report.skipped("compile.flashinfer-jit", reason)]
    toolkit = cuda_home.wheel_toolkit(str(env.site_packages()))
    if toolkit is None:
        problem = f"{NVCC_DISTRIBUTION} is pinned but nvidia/cu13/bin/nvcc is not in site-packages"
        return [report.failed("compile.nvcc", problem), report.failed("compile.flashinfer-jit", problem)]
    targets = [parse_target(target) for target in env.info["target_arch"]]
    with tempfile.TemporaryDirectory(prefix="smoke-compile-") as scratch:
        try:
            home = cuda_home.assemble(Path(scratch) / "cuda", toolkit)
        except (OSError, subprocess.CalledProcessError) as error:
            problem = f"cannot assemble a CUDA_HOME over {toolkit}: {_why(error)}"
            return [report.failed("compile.nvcc", problem), report.failed("compile.flashinfer-jit", problem)]
        nvcc = _nvcc(env, home, targets, Path(scratch))
        jit = _flashinfer_jit(env, home, targets, Path(scratch)) if nvcc.status == report.PASS else \
            report.skipped("compile.flashinfer-jit", "compile.nvcc failed")
    return [nvcc, jit]


def _why(error: Exception) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        lines = [line for line in (error.stderr or "").splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {error.returncode}"
    return str(error)


def _nvcc(env: Environment, home: Path, targets, scratch: Path) -> report.Result:
    check = "compile.nvcc"
    nvcc = str(home / "bin" / "nvcc")
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True,
                                 timeout=NVCC_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return report.failed(check, f"{nvcc} --version: {_why(error)}")
    found = _RELEASE.search(version)
    if not found:
        return report.failed(check, f"{nvcc} --version names no release")
    release = f"{found.group(1)}.{found.group(2)}"
    runtime = env.torch_facts().get("cuda")
    if runtime is None:
        return report.failed(check, f"cannot read the CUDA runtime's version: {env.torch_facts().get('error')}")
    runtime_minor = ".".join(str(runtime).split(".")[:2])
    if release != runtime_minor:
        return report.failed(check, f"nvcc is release {release}, the CUDA runtime {runtime_minor}: PTX it emits "
                                    "needs a driver of its own release (compat_data.toml [nvcc_runtime_minor])")
    source = scratch / "scale.cu"
    source.write_text(KERNEL)
    made = []
    for target in targets:
        cubin = scratch / f"scale.{target_name(target)}.cubin"
        arch = target_name(target)
        try:
            subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-o", str(cubin), str(source)],
                           capture_output=True, text=True, check=True, timeout=NVCC_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as error:
            return report.failed(check, f"nvcc -arch={arch} -cubin: {_why(error)}")
        with elf.ElfFile(str(cubin)) as obj:
            code = obj.device_code()
        if not any(item.kind == "sass" and item.runs_on(*target) for item in code):
            return report.failed(check, f"nvcc -arch={arch} made {[item.name for item in code]}, not {arch}")
        made.append(arch)
    return report.passed(check, f"nvcc {release} (runtime {runtime_minor}) compiled a kernel to "
                                f"{', '.join(made)} cubins")


def arch_list(targets) -> str:
    """FLASHINFER_CUDA_ARCH_LIST for the targets: "12.0f" (SM 12.x family code, what FlashInfer 0.7
    picks itself for SM 12.0 on CUDA >= 12.9); other majors as FlashInfer normalizes them."""
    return " ".join(f"{major}.{minor}f" if major == 12 else f"{major}.{minor}" for major, minor in targets)


def jit_environment(home: Path, workspace: Path, targets) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(CUDA_HOME=str(home), FLASHINFER_CUDA_ARCH_LIST=arch_list(targets),
               FLASHINFER_WORKSPACE_BASE=str(workspace), PATH=f"{home / 'bin'}:{env.get('PATH', '')}")
    return env


def _flashinfer_jit(env: Environment, home: Path, targets, scratch: Path) -> report.Result:
    check = "compile.flashinfer-jit"
    if not env.in_stack("flashinfer-python"):
        return report.skipped(check, "flashinfer-python is not part of this stack")
    workspace = scratch / "flashinfer"
    child = run_python(["-c", _JIT_BUILD], timeout=JIT_TIMEOUT_S, env=jit_environment(home, workspace, targets))
    if not child.ok:
        return report.failed(check, f"FlashInfer's JIT could not build pcie_ipc_comm: {child.reason()}")
    library = child.stdout.strip().splitlines()[-1]
    with elf.ElfFile(library) as obj:
        code = obj.device_code()
    missing = [target_name(t) for t in targets if not any(c.kind == "sass" and c.runs_on(*t) for c in code)]
    if missing:
        return report.failed(check, f"pcie_ipc_comm has {sorted({c.name for c in code})}, no SASS for {missing}")
    return report.passed(check, f"FlashInfer built pcie_ipc_comm for {arch_list(targets)}: "
                                f"{', '.join(sorted({c.name for c in code}))}")
