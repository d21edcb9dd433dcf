"""gpu: on a visible GPU, the device is the target and the kernels compute right.

Only where a GPU is visible; otherwise every row is skipped with the reason.
The computations run in a child interpreter (smoke_gpu_worker.py) so a CUDA
fault cannot take the report down with it.

- gpu.capability: every visible device's compute capability is a stack target;
- gpu.matmul, gpu.sgl-kernel-op, gpu.flashinfer-op: results agree with torch;
- gpu.nccl-all-reduce: an all-reduce across all visible GPUs gives the right sum.
"""

from __future__ import annotations

import json
import os

try:
    from . import smoke_report as report
    from .smoke_arch import parse_target
    from .smoke_env import Environment, run_python
except ImportError:  # run as a script from /opt/builder/runtime
    import smoke_report as report
    from smoke_arch import parse_target
    from smoke_env import Environment, run_python

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smoke_gpu_worker.py")
COMPUTE_CHECKS = ("matmul", "sgl-kernel-op", "flashinfer-op", "nccl-all-reduce")
# First use may JIT-compile flashinfer's kernel; the all-reduce starts NCCL.
WORKER_TIMEOUT_S = 900


def run(env: Environment) -> list[report.Result]:
    names = ["gpu.capability"] + [f"gpu.{name}" for name in COMPUTE_CHECKS]
    child = run_python([WORKER, repr(env.gpu_expect_offset)], timeout=WORKER_TIMEOUT_S)
    if not child.ok:
        return [report.failed(name, f"GPU worker failed: {child.reason()}") for name in names]
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    outcome = json.loads(lines[-1])
    if not outcome["devices"]:
        return [report.skipped(name, outcome["reason"]) for name in names]
    results = [_capability(env, outcome)]
    for name in COMPUTE_CHECKS:
        row = outcome["checks"][name]
        results.append(report.Result(f"gpu.{name}", row["status"], row["detail"]))
    return results


def _capability(env: Environment, outcome: dict) -> report.Result:
    targets = {parse_target(target) for target in env.info["target_arch"]}
    devices = [tuple(device) for device in outcome["devices"]]
    listing = ", ".join(f"GPU {index} {name} {major}.{minor}" for index, ((major, minor), name)
                        in enumerate(zip(devices, outcome.get("names", [""] * len(devices)))))
    wanted = ", ".join(f"{major}.{minor}" for major, minor in sorted(targets))
    if any(device not in targets for device in devices):
        return report.failed("gpu.capability", f"{listing}; the stack targets {wanted}")
    return report.passed("gpu.capability", listing)
