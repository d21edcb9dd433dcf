"""imports: the stack's modules import, each in its own interpreter.

A child process per module, so an undefined symbol, a missing library or a
segfault in one extension is captured with its message and the rest go on.
sgl_kernel registers its torch ops on import: a torch ABI mismatch shows here.
"""

from __future__ import annotations

from builder.runtime.smoke import report
from builder.runtime.smoke.env import Environment, run_python, side_by_side


def core_modules(env: Environment) -> list[tuple[str, str]]:
    """(module, distribution that provides it), in dependency order."""
    return [("torch", "torch"), ("sgl_kernel", env.kernel_distribution()), ("flashinfer", "flashinfer-python"),
            ("sglang.srt.server_args", "sglang")]


# Only a GPU container has the driver's libcuda.so.1; extensions linked
# against it cannot be imported without one, whatever their state.
_NEEDS_DRIVER = "libcuda.so.1: cannot open shared object file"


def run(env: Environment) -> list[report.Result]:
    modules = core_modules(env)
    for module in patched_modules(env.info):
        if module not in {name for name, _ in modules}:
            modules.append((module, None))
    return side_by_side(lambda pair: _import(env, *pair), modules)  # a child interpreter per module


def patched_modules(info: dict) -> list[str]:
    """Modules the patch series changes: "sglang/srt/server_args.py" -> "sglang.srt.server_args"."""
    modules: list[str] = []
    for patch in info["patches"]:
        for path in patch["files"]:
            if path.endswith(".py"):
                module = path[:-3].replace("/", ".")
                module = module.removesuffix(".__init__")
                if module not in modules:
                    modules.append(module)
    return modules


def _import(env: Environment, module: str, distribution: str | None) -> report.Result:
    check = f"imports.{module}"
    if distribution is not None and not env.in_stack(distribution):
        return report.skipped(check, f"{distribution} is not part of this stack")
    child = run_python(["-c", "import importlib, sys; importlib.import_module(sys.argv[1])",
                        module])
    if child.ok:
        return report.passed(check, f"import {module}")
    reason = child.reason()
    if _NEEDS_DRIVER in child.stderr and not env.driver_present():
        return report.skipped(check, f"needs the NVIDIA driver (libcuda.so.1), absent without a "
                                     f"GPU; the abi checks cover its other libraries ({reason})")
    return report.failed(check, reason)
