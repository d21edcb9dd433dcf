"""gpu: on a visible GPU, the device is the target and the kernels compute right.

Only where a GPU is visible; otherwise every row is skipped with the reason.
The computations run in a child interpreter (gpu_worker.py) so a CUDA
fault cannot take the report down with it.

- gpu.driver: the NVIDIA driver is at least the minimum for the stack's CUDA
  (stack.json "driver"); an older one fails this row, skips the rest and makes
  the smoke program exit 3, as `serve` and `bench` refuse it;
- gpu.capability: every visible device's compute capability is a stack target;
- gpu.matmul, gpu.sgl-kernel-op, gpu.flashinfer-op: results agree with torch;
- gpu.nccl-all-reduce: an all-reduce across all visible GPUs gives the right sum;
- gpu.flashinfer-allreduce-fusion, gpu.torch-symm-mem-all-reduce: with 2 or more
  GPUs, the fused all-reduce paths SGLang's profile switches turn on agree with
  the unfused NCCL path (gpu_collectives.py).
"""

from __future__ import annotations

import json
import os

from builder.runtime import driver
from builder.runtime.smoke import report
from builder.runtime.smoke.arch import parse_target
from builder.runtime.smoke.env import Environment, run_python

WORKER = "builder.runtime.smoke.gpu_worker"
# The directory holding builder/ (/opt in the image), for the worker's interpreter to import it from.
TOOLS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
COMPUTE_CHECKS = ("matmul", "sgl-kernel-op", "flashinfer-op", "nccl-all-reduce",
                  "flashinfer-allreduce-fusion", "torch-symm-mem-all-reduce")
# First use may JIT-compile flashinfer's kernels (the fused all-reduce's too); the all-reduces start NCCL.
WORKER_TIMEOUT_S = 900


DRIVER_CHECK = "gpu.driver"


def run(env: Environment) -> list[report.Result]:
    names = ["gpu.capability"] + [f"gpu.{name}" for name in COMPUTE_CHECKS]
    driver_row = _driver(env.info["driver"])
    if driver_row.status == report.FAIL:
        return [driver_row] + [report.skipped(name, "not run: the NVIDIA driver is too old for this stack")
                               for name in names]
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [TOOLS_ROOT, environment.get("PYTHONPATH")]))
    child = run_python(["-m", WORKER, repr(env.gpu_expect_offset)], timeout=WORKER_TIMEOUT_S, env=environment)
    if not child.ok:
        return [driver_row] + [report.failed(name, f"GPU worker failed: {child.reason()}") for name in names]
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    outcome = json.loads(lines[-1])
    if not outcome["devices"]:
        return [driver_row] + [report.skipped(name, outcome["reason"]) for name in names]
    results = [driver_row, _capability(env, outcome)]
    for name in COMPUTE_CHECKS:
        row = outcome["checks"][name]
        results.append(report.Result(f"gpu.{name}", row["status"], row["detail"]))
    return results


def driver_refused(results: list[report.Result]) -> bool:
    return any(r.check == DRIVER_CHECK and r.status == report.FAIL for r in results)


def _driver(requirement: dict) -> report.Result:
    installed = driver.installed_version()
    if installed is None:
        return report.skipped(DRIVER_CHECK, "no NVIDIA driver answers (nvidia-smi, "
                                            f"{driver.PROC_VERSION})")
    problem = driver.too_old(installed, requirement)
    if problem:
        return report.failed(DRIVER_CHECK, problem)
    return report.passed(DRIVER_CHECK, f"NVIDIA driver {installed}; CUDA {requirement['cuda']} needs "
                                       f"{requirement['minimum']} or newer ({requirement['source']})")


def _capability(env: Environment, outcome: dict) -> report.Result:
    targets = {parse_target(target) for target in env.info["target_arch"]}
    devices = [tuple(device) for device in outcome["devices"]]
    listing = ", ".join(f"GPU {index} {name} {major}.{minor}" for index, ((major, minor), name)
                        in enumerate(zip(devices, outcome.get("names", [""] * len(devices)))))
    wanted = ", ".join(f"{major}.{minor}" for major, minor in sorted(targets))
    if any(device not in targets for device in devices):
        return report.failed("gpu.capability", f"{listing}; the stack targets {wanted}")
    return report.passed("gpu.capability", listing)
