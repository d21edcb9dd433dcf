"""The GPU computations of the smoke checks, run in a child interpreter.

    python -m builder.runtime.smoke.gpu_worker OFFSET

Prints one JSON object: {"devices": [[major, minor], ...], "reason": str,
"checks": {name: {"status", "detail"}}}. Every result is compared with a torch
(or arithmetic) reference plus OFFSET: 0 in real runs; any other value plants
a wrong expectation, which every comparison must then report as a failure.
Standard library and the image's torch only; the checks across GPUs are in
gpu_collectives.py.
"""

from __future__ import annotations

import json
import sys
import traceback

from builder.runtime.smoke import gpu_collectives as collectives

# Checks across every GPU, each with the fewest GPUs it means anything on.
COLLECTIVE_CHECKS = {"nccl-all-reduce": 1, "flashinfer-allreduce-fusion": 2, "torch-symm-mem-all-reduce": 2}


def _outcome(ok: bool, detail: str) -> dict:
    return {"status": "pass" if ok else "fail", "detail": detail}


def _error(error: BaseException) -> dict:
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return {"status": "fail", "detail": last}


def _compare(name: str, got, reference, offset: float, atol: float, rtol: float) -> dict:
    import torch
    expected = reference + offset
    got = got.double().cpu()
    difference = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, atol=atol, rtol=rtol)
    return _outcome(ok, f"{name}: max |difference| {difference:.3g} (atol {atol}, rtol {rtol})")


def check_matmul(offset: float) -> dict:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=generator)
    b = torch.randn(512, 512, generator=generator)
    got = (a.cuda() @ b.cuda()).cpu()
    return _compare("fp32 512x512 matmul vs float64 CPU", got, a.double() @ b.double(), offset,
                    atol=1e-3, rtol=1e-4)


def _rmsnorm_inputs():
    import torch
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 1024, generator=generator).to(torch.bfloat16)
    weight = torch.rand(1024, generator=generator).to(torch.bfloat16) + 0.5
    eps = 1e-6
    xd, wd = x.double(), weight.double()
    reference = xd / torch.sqrt(xd.pow(2).mean(dim=-1, keepdim=True) + eps) * wd
    return x.cuda(), weight.cuda(), eps, reference


def check_module_rmsnorm(module_name: str, offset: float) -> dict:
    import importlib
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # reported by the imports check; here it only means "cannot run"
        return {"status": "skip", "detail": f"{module_name} cannot be imported: "
                                            f"{_error(error)['detail']}"}
    x, weight, eps, reference = _rmsnorm_inputs()
    got = module.rmsnorm(x, weight, eps)
    return _compare(f"{module_name}.rmsnorm bf16 16x1024 vs float64 reference", got, reference,
                    offset, atol=3e-2, rtol=2e-2)


def main(argv: list[str]) -> int:
    offset = float(argv[0]) if argv else 0.0
    report: dict = {"devices": [], "reason": "", "checks": {}}
    try:
        import torch
    except Exception as error:
        report["reason"] = f"torch cannot be imported: {_error(error)['detail']}"
        print(json.dumps(report))
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        report["reason"] = "no GPU visible (torch.cuda.is_available() is False)"
        print(json.dumps(report))
        return 0
    count = torch.cuda.device_count()
    report["devices"] = [list(torch.cuda.get_device_capability(index)) for index in range(count)]
    report["names"] = [torch.cuda.get_device_name(index) for index in range(count)]
    steps = {
        "matmul": lambda: check_matmul(offset),
        "sgl-kernel-op": lambda: check_module_rmsnorm("sgl_kernel", offset),
        "flashinfer-op": lambda: check_module_rmsnorm("flashinfer", offset),
    }
    for name, fewest in COLLECTIVE_CHECKS.items():
        steps[name] = (lambda check=name: collectives.run(check, count, offset)) if count >= fewest else (
            lambda fewest=fewest: {"status": "skip", "detail": f"needs {fewest} or more GPUs, {count} visible"})
    for name, step in steps.items():
        try:
            report["checks"][name] = step()
        except Exception as error:
            report["checks"][name] = _error(error)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
