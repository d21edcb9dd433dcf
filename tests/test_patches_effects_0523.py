"""What the sglang 0.5.23 series changes, run on the real patched code with the GPU stubbed.

As in test_patches_effects.py (whose tree loader and GPU stand-ins this reuses): the real 0.5.23
wheel (a cp311 platform wheel; only its Python files are imported) is unpacked pristine and
patched, and each module is imported straight from its tree with the real CPU torch. What is
faked, and why:
  - torch.cuda device queries and the calls that need a GPU or a process group: no GPU here.
  - sglang.srt.runtime_context: 0.5.23's platform facts (is_sm90/is_sm100/is_sm120) and the
    published server settings live there, behind msgspec and the whole argument tree; the stand-in
    answers the facts the code under test reads, set per test.
  - modules a module's *import* pulls in that the code under test never calls (each named below).
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from builder.patches import patch_series
from checkouts import REPO
from test_patches_effects import GROUP, Tree, gpu, symm_mem  # noqa: F401 (fixtures)

pytest.importorskip("torch", reason="the patched modules import torch (the CPU build is enough)")

pytestmark = pytest.mark.network

VERSION = "0.5.23"
SERIES = ("0001-torch-symm-mem-sm120.patch", "0002-allreduce-fusion-backend-sm120.patch")


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[bool, Path]:
    tmp = tmp_path_factory.mktemp("trees-0523")
    wheel = patch_series.fetch_wheel("sglang", VERSION)
    series = patch_series.series_for("sglang", VERSION, REPO / "patches")
    roots = {}
    for patched in (False, True):
        site = tmp / ("patched" if patched else "pristine")
        patch_series.unpack(wheel, site)
        if patched:
            results = patch_series.apply_series(series, site)
            assert [r.patch.path.name for r in results] == list(SERIES)
            assert all(r.ok for r in results), [r.problems for r in results]
        roots[patched] = site
    return roots


@pytest.fixture
def tree(trees, monkeypatch):
    """tree(patched, **platform) -> Tree with runtime_context answering those platform facts."""
    before = set(sys.modules)

    def make(patched: bool, *, sm: int = 120, backend=None, nnodes: int = 1, dp_attention: bool = False):
        t = Tree(trees[patched], monkeypatch)
        platform = types.SimpleNamespace(is_sm90=sm == 90, is_sm100=sm == 100, is_sm120=sm == 120)
        comm = types.SimpleNamespace(flashinfer_allreduce_fusion_backend=backend)
        t.stub(
            "sglang.srt.runtime_context",
            get_platform=lambda: platform,
            get_exec=lambda: types.SimpleNamespace(comm=comm),
            get_parallel=lambda: types.SimpleNamespace(nnodes=nnodes),
        )
        t.stub("sglang.srt.environ", envs=types.SimpleNamespace(
            SGLANG_OPT_USE_INKLING_CUSTOM_AR=types.SimpleNamespace(get=lambda: False)))
        t.stub("sglang.srt.utils", is_cuda=lambda: True, is_hip=lambda: False,
               is_flashinfer_available=lambda: True, get_bool_env_var=lambda name, default="false": False,
               is_gfx95_supported=lambda: False, is_gfx1250_supported=lambda: False)
        t.stub("sglang.srt.layers.dp_attention", is_dp_attention_enabled=lambda: dp_attention)
        return t

    yield make
    for name in set(sys.modules) - before:
        if name.split(".")[0] == "sglang":
            del sys.modules[name]


def test_patched_files_were_byte_compiled(trees):
    import importlib.util

    for rel in (
        "sglang/srt/distributed/device_communicators/all_reduce_utils.py",
        "sglang/srt/distributed/device_communicators/torch_symm_mem.py",
        "sglang/srt/layers/flashinfer_comm_fusion.py",
        "sglang/srt/layers/layer_boundary/residual/add_norm.py",
    ):
        assert Path(importlib.util.cache_from_source(str(trees[True] / rel))).is_file(), rel


# --- 0001-torch-symm-mem-sm120.patch ---------------------------------------------------


def test_symm_mem_size_table_has_capability_12(tree):
    sizes = tree(True).load("sglang.srt.distributed.device_communicators.all_reduce_utils") \
        .TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
    assert sorted(sizes) == [9, 10, 12]
    assert sizes[12] == {2: 64 * 2**20, 4: 64 * 2**20, 6: 128 * 2**20, 8: 128 * 2**20}


def load_symm_mem(tree, patched: bool):
    return tree(patched).load("sglang.srt.distributed.device_communicators.torch_symm_mem")


def test_unpatched_symm_mem_is_off_on_sm120_for_want_of_a_table(tree, gpu, symm_mem, caplog):
    gpu((12, 0))
    symm_mem.multicast_ptr = 0x7F0000000000
    with caplog.at_level(logging.WARNING):
        communicator = load_symm_mem(tree, patched=False).TorchSymmMemCommunicator(GROUP, 0)
    assert communicator.disabled
    assert "Device capability 12 not supported" in caplog.text


def test_symm_mem_on_sm120_pcie_switches_itself_off(tree, gpu, symm_mem, caplog):
    gpu((12, 0))
    with caplog.at_level(logging.WARNING):
        communicator = load_symm_mem(tree, patched=True).TorchSymmMemCommunicator(GROUP, 0)
    assert communicator.disabled
    assert communicator.max_size == 128 * 2**20
    assert "multicast operations are not supported" in caplog.text


def test_symm_mem_on_sm120_with_multicast_runs_two_shot(tree, gpu, symm_mem):
    gpu((12, 0))
    symm_mem.multicast_ptr = 0x7F0000000000
    tensor = torch_ones(4096)
    # 0.5.23 checks the tensor's device against the communicator's: both the CPU here.
    communicator = load_symm_mem(tree, patched=True).TorchSymmMemCommunicator(GROUP, tensor.device)
    assert not communicator.disabled
    assert communicator.should_torch_symm_mem_allreduce(tensor)
    out = communicator.all_reduce(tensor)
    assert symm_mem.kernels == ["two_shot"]
    assert out.equal(tensor)


def torch_ones(numel: int):
    import torch

    return torch.ones(numel, dtype=torch.bfloat16)


# --- 0002-allreduce-fusion-backend-sm120.patch -----------------------------------------


def load_fusion(tree, patched: bool, **platform):
    t = tree(patched, **platform)
    # Imported for the workspace and group checks, never reached by the backend decision.
    for name in (
        "sglang.srt.distributed.device_communicators.custom_all_reduce_utils",
        "sglang.srt.distributed.parallel_state",
    ):
        t.stub(name)
    t.stub("sglang.srt.utils.custom_op", register_custom_op=lambda **options: (lambda function: function))
    return t, t.load("sglang.srt.layers.flashinfer_comm_fusion")


@pytest.mark.parametrize("backend", ["auto", "trtllm"])
def test_unpatched_backend_resolution_refuses_sm120(tree, backend):
    _, fusion = load_fusion(tree, False, backend=backend)
    with pytest.raises(ValueError, match="requires SM90 or SM10X"):
        fusion.resolve_flashinfer_allreduce_fusion_backend()


@pytest.mark.parametrize("backend", ["auto", "trtllm"])
def test_explicit_backend_resolves_to_trtllm_on_sm120(tree, backend):
    _, fusion = load_fusion(tree, True, backend=backend)
    assert fusion.resolve_flashinfer_allreduce_fusion_backend() == "trtllm"


@pytest.mark.parametrize(("backend", "message"), [
    ("mnnvl", "mnnvl backend requires a Blackwell"), ("cutedsl", "cutedsl backend requires")])
def test_sm120_has_no_mnnvl_or_cutedsl(tree, backend, message):
    _, fusion = load_fusion(tree, True, backend=backend)
    with pytest.raises(ValueError, match=message):
        fusion.resolve_flashinfer_allreduce_fusion_backend()


def test_no_backend_means_no_fusion_on_sm120(tree):
    _, fusion = load_fusion(tree, True, backend=None)
    assert fusion.resolve_flashinfer_allreduce_fusion_backend() is None


def test_other_capabilities_still_refused(tree):
    _, fusion = load_fusion(tree, True, sm=80, backend="trtllm")
    with pytest.raises(ValueError, match="requires SM90, SM10X or SM120"):
        fusion.resolve_flashinfer_allreduce_fusion_backend()


def load_add_norm(tree, patched: bool, **platform):
    t, fusion = load_fusion(tree, patched, **platform)
    # No flashinfer in the tree, so the module marked the fusion unavailable; in the image
    # flashinfer.comm loads. Cleared, so that only the SM gate under test decides.
    assert fusion.is_flashinfer_allreduce_unavailable()
    fusion._flashinfer_allreduce_unavailable = False
    package = "sglang.srt.layers.layer_boundary.residual"
    # The residual package's __init__ and add_norm's other imports are the model layers.
    t.stub(package, __path__=[str(t.root.joinpath(*package.split(".")))], LayerResidualOps=types.SimpleNamespace)
    for name in (
        "sglang.srt.layers.layer_boundary.adapters.attention",
        "sglang.srt.layers.quantization.fp8_utils",
        "sglang.srt.model_executor.forward_batch_info",
    ):
        t.stub(name)
    return t.load(package + ".add_norm")


def test_unpatched_fusion_never_applies_on_sm120(tree):
    assert load_add_norm(tree, False, backend="trtllm").flashinfer_ar_fusion_applies(1) is False


def test_fusion_applies_on_sm120_with_a_backend(tree):
    add_norm = load_add_norm(tree, True, backend="trtllm")
    assert add_norm.flashinfer_ar_fusion_applies(1) is True
    assert add_norm.flashinfer_ar_fusion_applies(add_norm.FUSE_ALLREDUCE_MAX_BATCH_SIZE) is True
    assert add_norm.flashinfer_ar_fusion_applies(add_norm.FUSE_ALLREDUCE_MAX_BATCH_SIZE + 1) is False
    assert add_norm.flashinfer_ar_fusion_applies(0) is False


def test_fusion_still_needs_a_backend_on_sm120(tree):
    assert load_add_norm(tree, True, backend=None).flashinfer_ar_fusion_applies(1) is False


def test_fusion_stays_off_under_dp_attention_on_sm120(tree):
    assert load_add_norm(tree, True, backend="trtllm", dp_attention=True).flashinfer_ar_fusion_applies(1) is False


# --- opt-in only: the series leaves the auto-enable alone ------------------------------


def test_auto_enable_still_names_sm90_and_sm100_only(trees):
    """overrides.py's auto-enable condition is byte-identical in both trees and names no SM120."""
    rel = "sglang/srt/arg_groups/overrides.py"
    pristine, patched = ((trees[p] / rel).read_text() for p in (False, True))
    assert pristine == patched
    condition = patched.split("Auto-enabling FlashInfer AllReduce Fusion")[0].rsplit("if (", 1)[1]
    assert "(get_platform().is_sm90 or get_platform().is_sm100)" in condition
    assert "sm120" not in condition
