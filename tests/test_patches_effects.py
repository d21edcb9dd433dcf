"""What each patch changes, run on the real patched code with the GPU stubbed.

The sglang and flashinfer wheels are unpacked twice, pristine and patched, and
modules are imported straight from those trees with the real (CPU) torch. What
is faked, and why:
  - torch.cuda device queries (capability, name, availability) and the calls
    that need a GPU or a process group (set_device, symmetric-memory allocation
    and rendezvous, the all-reduce ops): there is no GPU here.
  - packages a module's *import* pulls in that are not installed here and that
    the code under test never calls (zmq, triton, PIL, tvm_ffi, ...), and sglang
    modules whose import closure is a GPU serving stack (parsers, MoE layers);
    each stand-in is named where it is used.
Parent packages are bare module objects pointing into the tree, so importing a
module runs that file, not its package's heavy __init__.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import sys
import types
from pathlib import Path

import pytest

from builder.patches import patch_series
from checkouts import REPO

torch = pytest.importorskip("torch", reason="the patched modules import torch (the CPU build is enough)")
import torch.distributed  # noqa: E402
import torch.distributed._symmetric_memory  # noqa: E402

pytestmark = pytest.mark.network

RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
# Imported by sglang/srt/utils/common.py at module level, not installed here, never called below.
COMMON_IMPORTS = ("psutil", "pybase64", "triton", "zmq", "PIL", "starlette", "starlette.routing", "tqdm")


class Placeholder(types.ModuleType):
    """A stand-in module: any attribute is another placeholder (import-time names only)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = Placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def unpack_tree(tmp: Path, patched: bool) -> Path:
    site = tmp / ("patched" if patched else "pristine")
    for dist, version in (("sglang", "0.5.9"), ("flashinfer-python", "0.6.4")):
        patch_series.unpack(patch_series.fetch_wheel(dist, version), site)
        if patched:
            results = patch_series.apply_series(patch_series.series_for(dist, version, REPO / "patches"), site)
            assert all(r.ok for r in results), [r.problems for r in results]
    return site


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[bool, Path]:
    tmp = tmp_path_factory.mktemp("trees")
    return {patched: unpack_tree(tmp, patched) for patched in (False, True)}


class Tree:
    """Imports modules from one unpacked site-packages tree, undone after the test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.monkeypatch = monkeypatch
        monkeypatch.syspath_prepend(str(root))  # find_spec("flashinfer") sees the tree's flashinfer

    def stub(self, name: str, **attributes) -> types.ModuleType:
        module = Placeholder(name)
        module.__dict__.update(attributes)
        self.monkeypatch.setitem(sys.modules, name, module)
        return module

    def _bare_parents(self, dotted: str) -> None:
        parts = dotted.split(".")
        for depth in range(1, len(parts)):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(self.root.joinpath(*parts[:depth]))]
                sys.modules[name] = package

    def load(self, dotted: str) -> types.ModuleType:
        self._bare_parents(dotted)
        return importlib.import_module(dotted)

    def load_package_init(self, dotted: str) -> types.ModuleType:
        """Run a package's real __init__.py (sglang.srt.utils re-exports common's checks)."""
        self._bare_parents(dotted + ".__init__")
        directory = self.root.joinpath(*dotted.split("."))
        spec = importlib.util.spec_from_file_location(
            dotted, directory / "__init__.py", submodule_search_locations=[str(directory)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[dotted] = module
        spec.loader.exec_module(module)
        return module

    def load_sglang_utils(self) -> types.ModuleType:
        for name in COMMON_IMPORTS:
            self.stub(name)
        return self.load_package_init("sglang.srt.utils")


@pytest.fixture
def gpu(monkeypatch):
    """Set the (single kind of) GPU every device query reports."""

    def install(capability: tuple[int, int], name: str = RTX_PRO_6000, count: int = 8):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.version, "cuda", "13.0")
        monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)

    return install


@pytest.fixture
def tree(trees, monkeypatch):
    """tree(patched) -> Tree; every module loaded from a tree is forgotten afterwards."""
    before = set(sys.modules)
    yield lambda patched: Tree(trees[patched], monkeypatch)
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("sglang", "flashinfer"):
            del sys.modules[name]


def test_patched_files_were_byte_compiled(trees):
    root = trees[True]
    for rel in (
        "sglang/srt/distributed/device_communicators/all_reduce_utils.py",
        "sglang/srt/distributed/device_communicators/torch_symm_mem.py",
        "sglang/srt/layers/communicator.py",
        "flashinfer/jit/comm.py",
    ):
        source = root / rel
        assert Path(importlib.util.cache_from_source(str(source))).is_file(), rel


# --- 0001-torch-symm-mem-sm120.patch ---------------------------------------------------


def test_symm_mem_size_table_has_capability_12(tree):
    table = tree(True).load("sglang.srt.distributed.device_communicators.all_reduce_utils")
    sizes = table.TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
    assert sorted(sizes) == [9, 10, 12]
    assert sizes[12] == {2: 64 * 2**20, 4: 64 * 2**20, 6: 128 * 2**20, 8: 128 * 2**20}


@pytest.fixture
def symm_mem(monkeypatch):
    """The GPU side of torch symmetric memory, recording which all-reduce kernel ran."""
    symm = torch.distributed._symmetric_memory
    state = types.SimpleNamespace(multicast_ptr=0, kernels=[])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 8)
    monkeypatch.setattr(symm, "empty", lambda numel, device=None, dtype=None: torch.empty(numel, dtype=dtype))
    monkeypatch.setattr(
        symm, "rendezvous", lambda buffer, group_name: types.SimpleNamespace(multicast_ptr=state.multicast_ptr)
    )
    ops = types.SimpleNamespace(
        two_shot_all_reduce_=lambda buffer, op, group: state.kernels.append("two_shot"),
        multimem_all_reduce_=lambda buffer, op, group: state.kernels.append("multimem"),
    )
    monkeypatch.setattr(torch.ops, "symm_mem", ops)
    return state


def load_symm_mem(tree, patched: bool):
    t = tree(patched)
    t.load_sglang_utils()
    return t.load("sglang.srt.distributed.device_communicators.torch_symm_mem")


GROUP = types.SimpleNamespace(group_name="tp")


def test_unpatched_symm_mem_dies_with_keyerror_on_sm120(tree, gpu, symm_mem):
    gpu((12, 0))
    module = load_symm_mem(tree, patched=False)
    with pytest.raises(KeyError, match="12"):
        module.TorchSymmMemCommunicator(GROUP, 0)


def test_symm_mem_on_sm120_pcie_switches_itself_off_instead_of_crashing(tree, gpu, symm_mem, caplog):
    gpu((12, 0))
    module = load_symm_mem(tree, patched=True)
    with caplog.at_level(logging.WARNING):
        communicator = module.TorchSymmMemCommunicator(GROUP, 0)
    assert communicator.disabled
    assert communicator.max_size == 128 * 2**20
    assert "multicast operations are not supported" in caplog.text


def test_symm_mem_on_sm120_with_multicast_runs_two_shot(tree, gpu, symm_mem):
    gpu((12, 0))
    symm_mem.multicast_ptr = 0x7F0000000000
    module = load_symm_mem(tree, patched=True)
    communicator = module.TorchSymmMemCommunicator(GROUP, 0)
    assert not communicator.disabled
    tensor = torch.ones(4096, dtype=torch.bfloat16)
    assert communicator.should_torch_symm_mem_allreduce(tensor)
    assert not communicator.should_torch_symm_mem_allreduce(torch.ones(64 * 2**20, dtype=torch.bfloat16))
    out = communicator.all_reduce(tensor)
    assert symm_mem.kernels == ["two_shot"]
    assert torch.equal(out, tensor)


def test_symm_mem_without_a_size_table_warns_instead_of_keyerror(tree, gpu, symm_mem, caplog):
    gpu((11, 0))  # a capability with no table at all
    module = load_symm_mem(tree, patched=True)
    with caplog.at_level(logging.WARNING):
        communicator = module.TorchSymmMemCommunicator(GROUP, 0)
    assert communicator.disabled
    assert "Device capability 11 has no size table" in caplog.text


# --- no auto-enable on SM120: fusion is an explicit profile switch ---------------------

# server_args.py imports these only for CLI choices and config helpers never reached here;
# their own imports are the OpenAI protocol models, transformers and triton kernels.
SERVER_ARGS_HEAVY = (
    "sglang.srt.function_call.function_call_parser",
    "sglang.srt.parser.reasoning_parser",
    "sglang.srt.utils.hf_transformers_utils",
    "sglang.srt.layers.attention.fla.chunk_delta_h",
    "safetensors",
    "safetensors.torch",
)


def fusion_after_model_adjustments(tree, patched: bool, architecture: str, **settings) -> bool:
    """Run ServerArgs' real model-specific adjustments for one model; report the fusion flag."""
    t = tree(patched)
    for name in SERVER_ARGS_HEAVY:
        t.stub(name)
    t.stub("sglang.srt.configs.model_config", is_deepseek_nsa=lambda hf_config: False)
    t.load_sglang_utils()
    module = t.load("sglang.srt.server_args")
    # A ServerArgs with every default, skipping __post_init__ (which needs a device and a model).
    args = object.__new__(module.ServerArgs)
    for field in dataclasses.fields(module.ServerArgs):
        if field.default is not dataclasses.MISSING:
            setattr(args, field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            setattr(args, field.name, field.default_factory())
    args.model_path = "/models/Kimi-K2.5"
    args.tp_size = 8
    for name, value in settings.items():
        setattr(args, name, value)
    hf_config = types.SimpleNamespace(architectures=[architecture])
    args.get_model_config = lambda: types.SimpleNamespace(hf_config=hf_config)
    args._handle_model_specific_adjustments()
    return args.enable_flashinfer_allreduce_fusion


KIMI = "KimiK25ForConditionalGeneration"


@pytest.mark.parametrize(
    ("capability", "patched", "expected"),
    [
        ((12, 0), False, False),
        ((12, 0), True, False),  # the series leaves server_args.py alone: SM120 never turns it on by itself
        ((9, 0), True, True),  # SM90 and SM100 as upstream
        ((10, 0), True, True),
        ((8, 0), True, False),
    ],
)
def test_fusion_is_never_auto_enabled_on_sm120(tree, gpu, capability, patched, expected):
    gpu(capability)
    assert fusion_after_model_adjustments(tree, patched, KIMI) is expected


# --- 0002-allreduce-fusion-apply-sm120.patch --------------------------------------------


def load_communicator(tree, patched: bool, enabled: bool = True, dp_attention: bool = False):
    t = tree(patched)
    t.load_sglang_utils()
    # communicator.py's own imports are the distributed runtime, MoE and attention layers:
    # stand-ins, except the two the fusion decision reads.
    for name in (
        "sglang.srt.distributed",
        "sglang.srt.distributed.device_communicators.pynccl_allocator",
        "sglang.srt.layers.attention.nsa.utils",
        "sglang.srt.layers.moe",
        "sglang.srt.model_executor.forward_batch_info",
        "sglang.srt.speculative.spec_info",
    ):
        t.stub(name)
    t.stub("sglang.srt.layers.dp_attention", is_dp_attention_enabled=lambda: dp_attention)
    server_args = types.SimpleNamespace(enable_flashinfer_allreduce_fusion=enabled)
    t.stub("sglang.srt.server_args", get_global_server_args=lambda: server_args)
    return t.load("sglang.srt.layers.communicator")


def test_unpatched_communicator_ignores_explicit_fusion_on_sm120(tree, gpu):
    gpu((12, 0))
    communicator = load_communicator(tree, patched=False)
    assert communicator.apply_flashinfer_allreduce_fusion(1) is False


def test_communicator_applies_fusion_on_sm120(tree, gpu):
    gpu((12, 0))
    communicator = load_communicator(tree, patched=True)
    assert communicator._is_flashinfer_available  # the tree's real flashinfer package is found
    assert communicator.apply_flashinfer_allreduce_fusion(1) is True
    assert communicator.apply_flashinfer_allreduce_fusion(communicator.FUSE_ALLREDUCE_MAX_BATCH_SIZE) is True
    assert communicator.apply_flashinfer_allreduce_fusion(communicator.FUSE_ALLREDUCE_MAX_BATCH_SIZE + 1) is False
    assert communicator.apply_flashinfer_allreduce_fusion(0) is False


def test_communicator_fusion_still_needs_the_flag_on_sm120(tree, gpu):
    gpu((12, 0))
    assert load_communicator(tree, patched=True, enabled=False).apply_flashinfer_allreduce_fusion(1) is False


def test_communicator_fusion_stays_off_on_sm80(tree, gpu):
    gpu((8, 0))
    assert load_communicator(tree, patched=True).apply_flashinfer_allreduce_fusion(1) is False


# --- flashinfer-python 0001-trtllm-comm-sm120.patch -------------------------------------


def load_flashinfer_comm(tree, patched: bool):
    t = tree(patched)
    t.stub("tvm_ffi")  # the JIT loader's native runtime; building a JitSpec never calls it
    return t.load("flashinfer.jit.comm")


def test_unpatched_trtllm_comm_module_cannot_target_sm120(tree, gpu):
    gpu((12, 0))
    comm = load_flashinfer_comm(tree, patched=False)
    with pytest.raises(RuntimeError, match=r"No supported CUDA architectures found for major versions \[9, 10\]"):
        comm.gen_trtllm_comm_module()


def test_trtllm_comm_module_targets_sm120(tree, gpu):
    gpu((12, 0))
    spec = load_flashinfer_comm(tree, patched=True).gen_trtllm_comm_module()
    gencodes = [flag for flag in spec.extra_cuda_cflags if flag.startswith("-gencode=")]
    assert gencodes == ["-gencode=arch=compute_120a,code=sm_120a"]
    assert [source.name for source in spec.sources] == [
        "trtllm_allreduce.cu",
        "trtllm_allreduce_fusion.cu",
        "trtllm_moe_allreduce_fusion.cu",
    ]
    assert all(source.is_file() for source in spec.sources)


def test_trtllm_comm_module_architecture_list_includes_12(tree, gpu, monkeypatch):
    gpu((12, 0))
    comm = load_flashinfer_comm(tree, patched=True)
    asked = []
    real = comm.current_compilation_context.get_nvcc_flags_list

    def record(supported_major_versions=None):
        asked.append(supported_major_versions)
        return real(supported_major_versions=supported_major_versions)

    monkeypatch.setattr(comm.current_compilation_context, "get_nvcc_flags_list", record)
    comm.gen_trtllm_comm_module()
    assert asked == [[9, 10, 12]]
