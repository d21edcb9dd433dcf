"""The smoke checks that run across every visible GPU, one process per GPU.

Called by gpu_worker.py in its child interpreter; torch and flashinfer are
imported inside the ranks. Each check returns {"status", "detail"}.

- nccl-all-reduce: a plain NCCL all-reduce gives the exact sum.
- flashinfer-allreduce-fusion: FlashInfer's fused all-reduce + residual add +
  RMSNorm, the call SGLang makes under `--enable-flashinfer-allreduce-fusion`
  (sglang/srt/layers/flashinfer_comm_fusion.py: trtllm_allreduce_fusion with
  kARResidualRMSNorm on a trtllm IPC workspace), against the unfused path
  SGLang takes otherwise: NCCL all-reduce, then residual add and RMSNorm. Both
  kernels are run, one-shot (decode-sized batches) and two-shot.
- torch-symm-mem-all-reduce: torch's symmetric-memory two-shot all-reduce, the
  kernel SGLang's TorchSymmMemCommunicator calls under `--enable-torch-symm-mem`
  where it does not use multimem (always on SM120), against NCCL; skipped where
  the symmetric buffer does not initialise.

A kernel that compiles for a new architecture but computes wrong values passes
every import and launch; only these comparisons catch it. Every expectation is
shifted by OFFSET: a non-zero OFFSET must make every comparison fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import traceback

# Kimi K2.5's hidden size; one-shot for a decode-sized batch, two-shot above the world size.
HIDDEN = 7168
FUSION_VARIANTS = (("one-shot", 8, True), ("two-shot", 128, False))
FUSION_MAX_TOKENS = 128
RMS_EPS = 1e-6
SYMM_MEM_ELEMENTS = 1 << 20
# bf16 keeps 8 significant bits (relative step 2**-7): allow about two steps either way.
ATOL = 2e-2
RTOL = 2e-2


def _inputs(rank: int, tokens: int):
    """This rank's bf16 hidden states and the residual/weight every rank shares."""
    import torch
    mine = torch.Generator().manual_seed(1000 + rank)
    shared = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, HIDDEN, generator=mine).to(torch.bfloat16)
    residual = torch.randn(tokens, HIDDEN, generator=shared).to(torch.bfloat16)
    weight = (torch.rand(HIDDEN, generator=shared) + 0.5).to(torch.bfloat16)
    device = f"cuda:{rank}"
    return x.to(device), residual.to(device), weight.to(device)


def _difference(got, expected) -> tuple[float, bool]:
    """(max |got - expected|, within ATOL + RTOL * |expected| everywhere)."""
    import torch
    got, expected = got.double(), expected.double()
    return (got - expected).abs().max().item(), bool(torch.allclose(got, expected, atol=ATOL, rtol=RTOL))


def _rmsnorm(hidden, weight):
    import torch
    h = hidden.float()
    normed = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * weight.float()
    return normed.to(torch.bfloat16)


def _nccl(rank: int, world: int, offset: float) -> dict:
    import torch
    import torch.distributed as dist
    tensor = torch.full((1 << 20,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    expected = world * (world + 1) / 2 + offset
    low, high = tensor.min().item(), tensor.max().item()
    return {"ok": low == expected and high == expected, "detail": f"expected {expected:g}, got [{low:g}, {high:g}]"}


def _fusion(rank: int, world: int, offset: float) -> dict:
    import torch
    import torch.distributed as dist
    import flashinfer.comm as comm
    group = dist.group.WORLD
    handles, workspace = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        rank, world, FUSION_MAX_TOKENS, HIDDEN, group=group)
    parts, ok = [], True
    try:
        for name, tokens, oneshot in FUSION_VARIANTS:
            x, residual, weight = _inputs(rank, tokens)
            reduced = x.clone()
            dist.all_reduce(reduced)
            want_residual = (reduced.float() + residual.float()).to(torch.bfloat16)
            want_norm = _rmsnorm(want_residual, weight)
            norm_out, residual_out = torch.empty_like(x), torch.empty_like(x)
            comm.trtllm_allreduce_fusion(
                allreduce_in=x, world_size=world, world_rank=rank, token_num=tokens, hidden_dim=HIDDEN,
                workspace_ptrs=workspace, launch_with_pdl=True, use_oneshot=oneshot,
                trigger_completion_at_end=False, fp32_acc=False,
                pattern_code=comm.AllReduceFusionPattern.kARResidualRMSNorm, allreduce_out=None,
                residual_in=residual, residual_out=residual_out, norm_out=norm_out, quant_out=None,
                scale_out=None, rms_gamma=weight, rms_eps=RMS_EPS, scale_factor=None, layout_code=None)
            torch.cuda.synchronize()
            norm_diff, norm_ok = _difference(norm_out, want_norm.double() + offset)
            residual_diff, residual_ok = _difference(residual_out, want_residual.double() + offset)
            ok = ok and norm_ok and residual_ok
            parts.append(f"{name} {tokens}x{HIDDEN}: norm max |difference| {norm_diff:.3g}, "
                         f"residual {residual_diff:.3g}")
    finally:
        comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, group=group)
    return {"ok": ok, "detail": "; ".join(parts)}


def _symm_mem(rank: int, world: int, offset: float) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    group_name = dist.group.WORLD.group_name
    try:
        buffer = symm_mem.empty(SYMM_MEM_ELEMENTS, dtype=torch.bfloat16, device=f"cuda:{rank}")
        handle = symm_mem.rendezvous(buffer, group_name)
    except Exception as error:  # no symmetric memory here: SGLang's communicator stays off too
        return {"skip": f"torch symmetric memory does not initialise: {_last_line(error)}"}
    x = torch.randn(SYMM_MEM_ELEMENTS, generator=torch.Generator().manual_seed(2000 + rank))
    x = x.to(torch.bfloat16).to(f"cuda:{rank}")
    reference = x.clone()
    dist.all_reduce(reference)
    buffer.copy_(x)
    torch.ops.symm_mem.two_shot_all_reduce_(buffer, "sum", group_name)
    torch.cuda.synchronize()
    difference, ok = _difference(buffer, reference.double() + offset)
    multicast = "" if handle.multicast_ptr else (
        "; no multicast here, so SGLang's TorchSymmMemCommunicator would switch itself off")
    return {"ok": ok, "detail": f"two-shot bf16 {SYMM_MEM_ELEMENTS} elements: max |difference| "
                                f"{difference:.3g}{multicast}"}


CHECKS = {"nccl-all-reduce": _nccl, "flashinfer-allreduce-fusion": _fusion,
          "torch-symm-mem-all-reduce": _symm_mem}
TITLES = {
    "nccl-all-reduce": "NCCL all-reduce of ranks 1..{n} over {n} GPUs",
    "flashinfer-allreduce-fusion": "FlashInfer fused all-reduce+residual+RMSNorm over {n} GPUs vs NCCL "
                                   f"then RMSNorm (atol {ATOL}, rtol {RTOL})",
    "torch-symm-mem-all-reduce": f"torch symmetric-memory all-reduce over {{n}} GPUs vs NCCL (atol {ATOL}, rtol {RTOL})",
}


def _last_line(error: BaseException) -> str:
    return traceback.format_exception_only(type(error), error)[-1].strip()


def _rank(rank: int, world: int, check: str, offset: float, init_file: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            device_id=torch.device(f"cuda:{rank}"))
    try:
        outcome = CHECKS[check](rank, world, offset)
    except Exception as error:
        outcome = {"ok": False, "detail": _last_line(error)}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(outcome, handle)


def run(check: str, devices: int, offset: float) -> dict:
    """One process per GPU runs `check`; the row fails when any rank's comparison fails."""
    if check == "flashinfer-allreduce-fusion" and importlib.util.find_spec("flashinfer") is None:
        return {"status": "skip", "detail": "flashinfer is not installed"}
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as work:
        mp.spawn(_rank, args=(devices, check, offset, os.path.join(work, "rendezvous"), work),
                 nprocs=devices, join=True)
        outcomes = []
        for rank in range(devices):
            with open(os.path.join(work, f"rank{rank}.json"), encoding="utf-8") as handle:
                outcomes.append(json.load(handle))
    title = TITLES[check].format(n=devices)
    skips = [o["skip"] for o in outcomes if "skip" in o]
    if skips:
        return {"status": "skip", "detail": f"{title}: {skips[0]}"}
    wrong = [f"rank {rank}: {o['detail']}" for rank, o in enumerate(outcomes) if not o["ok"]]
    shown = "; ".join(wrong) if wrong else outcomes[0]["detail"]
    return {"status": "fail" if wrong else "pass", "detail": f"{title}: {shown}"}
