"""versions: what is installed is exactly what the stack pinned.

- versions.<distribution>: installed version equals stack.json's pin (local tag included);
- versions.torch-cuda: torch.version.cuda has the stack's CUDA major.minor;
- versions.cuda-runtime: the CUDA runtime libraries installed as wheels, and their major.
"""

from __future__ import annotations

from builder.runtime.smoke import report
from builder.runtime.smoke.env import Environment, normalize

# Wheels that carry the CUDA runtime libraries (cu12 builds name the major in
# the distribution; CUDA 13 wheels are unsuffixed and versioned 13.x).
_CUDA_LIBRARY_PREFIXES = ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cuda-nvrtc",
                          "nvidia-nccl", "nvidia-cudnn")


def run(env: Environment) -> list[report.Result]:
    results = [_pinned(env, name, version) for name, version in sorted(env.pinned.items())]
    results.append(_torch_cuda(env))
    results.append(_cuda_runtime(env))
    return results


def _pinned(env: Environment, name: str, pinned: str) -> report.Result:
    check = f"versions.{normalize(name)}"
    installed = env.installed_version(name)
    if installed is None:
        return report.failed(check, f"{name} is not installed (pinned {pinned})")
    if installed != pinned:
        return report.failed(check, f"{name} {installed} installed, stack pins {pinned}")
    return report.passed(check, f"{name} {installed}")


def _cuda_major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _torch_cuda(env: Environment) -> report.Result:
    check = "versions.torch-cuda"
    want = _cuda_major_minor(env.info["cuda"])
    facts = env.torch_facts()
    if "error" in facts:
        return report.failed(check, f"cannot import torch: {facts['error']}")
    have = facts["cuda"]
    if have is None:
        return report.failed(check, f"torch {facts['version']} is a CPU build "
                                    f"(torch.version.cuda is None); the stack needs CUDA {want}")
    if _cuda_major_minor(have) != want:
        return report.failed(check, f"torch {facts['version']} is built for CUDA {have}; "
                                    f"the stack needs CUDA {want}")
    return report.passed(check, f"torch {facts['version']} built for CUDA {have}")


def _cuda_runtime(env: Environment) -> report.Result:
    check = "versions.cuda-runtime"
    major = env.info["cuda"].split(".")[0]
    libraries = {name: version for name, version in env.installed_distributions().items()
                 if name.startswith(_CUDA_LIBRARY_PREFIXES)}
    listing = ", ".join(f"{name} {version}" for name, version in sorted(libraries.items()))
    runtimes = {name: version for name, version in libraries.items()
                if name.startswith("nvidia-cuda-runtime")}
    if not runtimes:
        facts = env.torch_facts()
        if facts.get("cuda"):
            return report.failed(check, f"torch is built for CUDA {facts['cuda']} but no "
                                        "nvidia-cuda-runtime wheel is installed")
        return report.skipped(check, "no CUDA runtime wheel installed and torch is not a "
                                     "CUDA build")
    wrong = sorted(f"{name} {version}" for name, version in runtimes.items()
                   if not _runtime_matches(name, version, major))
    if wrong:
        return report.failed(check, f"CUDA runtime for another major than {major}: "
                                    f"{', '.join(wrong)} (installed: {listing})")
    return report.passed(check, listing)


def _runtime_matches(name: str, version: str, major: str) -> bool:
    if name.endswith(("-cu11", "-cu12", "-cu13")):
        return name.rsplit("-cu", 1)[1] == major
    return version.split(".")[0] == major
