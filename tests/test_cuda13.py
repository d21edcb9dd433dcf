"""The CUDA 13 row family (sglang-0.5.23): its compatibility rules, the PCIe all-reduce mode, the
image's compiler checks, the FlashInfer modules baked for the serve modes and the bench record's
communication settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from builder.config.compat import compat_data
from builder.config.matrix import MatrixError, load_matrix
from builder.render import render
from builder.runtime import cuda_home, flashinfer_bake, stable_nvcc
from builder.runtime.binaries import elf
from builder.runtime.serve import bench, launch
from builder.runtime.smoke import report, toolchain
from builder.runtime.smoke.env import Environment
from checkouts import REPO, link_project_files

MATRIX_TEXT = (REPO / "matrix.toml").read_text()
NEW = REPO / "images" / "sglang-0.5.23-cu130-local"
OLD = REPO / "images" / "sglang-0.5.9-cu128-local"


def stack_json(directory: Path) -> dict:
    return json.loads((directory / "stack.json").read_text())


def problems(tmp_path: Path, old: str, new: str) -> str:
    assert old in MATRIX_TEXT, old
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX_TEXT.replace(old, new, 1))
    link_project_files(tmp_path)
    with pytest.raises(MatrixError) as caught:
        load_matrix(path)
    return "\n".join(caught.value.problems)


# --- the rows ------------------------------------------------------------------------------------


def test_the_cuda13_rows_take_every_wheel_from_the_default_index():
    for local in (False, True):
        matrix = load_matrix(REPO / "matrix.toml", local_base=local)
        row = matrix.stack("sglang-0.5.23-cu130" + ("-local" if local else ""))
        assert row.cuda == "13.0.1"
        assert all(p.index is None and p.url is None for p in row.packages), row.packages
        assert {p.name: p.version for p in row.packages} == {
            "sglang": "0.5.23", "flashinfer-python": "0.7.2", "torch": "2.14.1", "sglang-kernel": "0.4.10",
            "nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-nvvm": "13.0.88"}
    assert load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu130").package("nvidia-cuda-nvcc") is None


def test_a_compiler_newer_than_the_runtime_is_refused(tmp_path):
    found = problems(tmp_path, 'nvidia-cuda-nvcc = { version = "13.0.88" }', 'nvidia-cuda-nvcc = { version = "13.5.37" }')
    assert "nvidia-cuda-nvcc 13.5.37 is not the CUDA runtime's release 13.0 (torch's)" in found
    assert compat_data()["nvcc_runtime_minor"]["source"].startswith("NVIDIA CUDA Compatibility guide")


def test_pcie_allreduce_mode_is_refused_in_one_line_where_sglang_lacks_it(tmp_path):
    mode = ('[stack.serve.modes.pcie-ar]\nargs = { tp_size = 8 }\nenv = { SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = "1" }\n\n'
            '[stack.serve.modes.eagle3]\n')
    found = problems(tmp_path, "[stack.serve.modes.eagle3]\n", mode)
    lines = [line for line in found.splitlines() if "PCIE" in line]
    assert len(lines) == 1
    assert lines[0].endswith("sglang-0.5.9: serve mode pcie-ar sets SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, but sglang 0.5.9 "
                             "has no pcie-ipc-allreduce (sglang/srt/distributed/device_communicators/pcie_ipc_ar.py); "
                             "it is in sglang 0.5.23")


def test_pcie_allreduce_fact_quotes_upstreams_figures_as_upstreams():
    fact = compat_data()["serve_features"]["pcie-ipc-allreduce"]
    assert fact["upstream_figures"].startswith("upstream's")
    assert "5.3 us against 205.1 us" in fact["upstream_figures"] and "21.14 -> 13.62 ms" in fact["upstream_figures"]


@pytest.mark.network
def test_pcie_allreduce_module_is_in_the_listed_sglang_wheels_only():
    import zipfile

    from builder.patches.patch_series import fetch_wheel

    fact = compat_data()["serve_features"]["pcie-ipc-allreduce"]
    for version, present in [*((v, True) for v in fact["sglang"]), *((v, False) for v in fact["lacking"])]:
        with zipfile.ZipFile(fetch_wheel("sglang", version)) as wheel:
            assert (fact["module"] in wheel.namelist()) is present, version


def test_pcie_mode_renders_into_the_launch_environment_and_compose():
    stack = stack_json(NEW)
    options = launch.ServeOptions(mode="pcie-ar", model="/models/m")
    plan = launch.build_plan(stack, options, "/opt/venv/bin/python")
    assert plan.env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    assert "--disable-custom-all-reduce" in plan.command
    compose = (NEW / "compose.yaml").read_text()
    service = compose[compose.index("  pcie-ar:"):]
    assert 'SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: "1"' in service.split("\n\n")[0]


def test_stacks_with_nvcc_point_cuda_home_at_the_built_toolkit():
    for directory, expected in ((NEW, str(flashinfer_bake.CUDA_HOME_DIR)), (OLD, None)):
        stack = stack_json(directory)
        env = launch.planned_env(stack, stack["serve"]["modes"]["baseline"], "/cache")
        assert env.get("CUDA_HOME") == expected


# --- the bench record ----------------------------------------------------------------------------


def test_bench_record_names_the_modes_communication_settings():
    stack = stack_json(NEW)
    assert bench.communication(stack, "pcie-ar") == {
        "args": {"tp_size": 8, "disable_custom_all_reduce": True},
        "env": {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}}
    assert bench.communication(stack, "baseline-fusion")["args"]["flashinfer_allreduce_fusion_backend"] == "trtllm"
    caller = bench.communication(stack, "baseline", {"NCCL_P2P_DISABLE": "1", "HOME": "/root"})
    assert caller["env"] == {"NCCL_P2P_DISABLE": "1"}


def test_a_run_with_other_communication_settings_is_not_judged_against_the_modes_figure():
    figure = bench.Reference(90.0, "sglang-x's own pinned figure for baseline", {"tok_s": 90.0})
    declared = {"args": {"tp_size": 8}, "env": {}}
    same = bench.comparable(figure, declared, {"args": {"tp_size": 8}, "env": {}})
    assert same is figure
    other = bench.comparable(figure, declared, {"args": {"tp_size": 8}, "env": {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}})
    assert other.tok_s is None and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in other.why
    assert bench.verdict(80.0, other.tok_s, 0.03) == (None, "unpinned")
    given = bench.Reference(90.0, "given on the command line (--reference)")
    assert bench.comparable(given, declared, {"args": {}, "env": {"NCCL_P2P_DISABLE": "1"}}) is given


# --- baked FlashInfer modules -------------------------------------------------------------------


def test_the_serve_modes_name_the_modules_to_bake():
    assert flashinfer_bake.needed_modules(stack_json(NEW)) == ["pcie_ipc_comm", "trtllm_comm"]
    assert flashinfer_bake.arch_list(stack_json(NEW)) == "12.0f"
    assert "flashinfer_bake" in (NEW / "Dockerfile").read_text()
    assert "flashinfer_bake" not in (OLD / "Dockerfile").read_text()  # no nvcc wheel, nothing baked


def test_the_bake_reads_only_its_inputs_and_a_sglang_patch_comes_after_it():
    """bake.json holds what the bake reads (modules, targets, cache dir), so a patch's hash in stack.json
    cannot start it again; the bake comes before the patches of sglang, which it never imports, and a
    patch of flashinfer (whose sources it compiles) would come before it."""
    inputs = json.loads((NEW / "bake.json").read_text())
    assert inputs == flashinfer_bake.bake_inputs(stack_json(NEW)) == {
        "modules": ["pcie_ipc_comm", "trtllm_comm"], "serve": {"cache_dir": "/cache"}, "target_arch": ["12.0"]}
    steps = [line for line in (NEW / "Dockerfile").read_text().splitlines() if line.startswith(("RUN", "COPY"))]
    bake = next(i for i, step in enumerate(steps) if "flashinfer_bake" in step and step.startswith("RUN"))
    patches = [i for i, step in enumerate(steps) if "apply_patch.py" in step and step.startswith("RUN")]
    assert len(patches) == 2 and bake < min(patches)
    assert not any("stack.json" in step for step in steps[:bake])
    # The byte-compile comes right after the bake, which writes no bytecode, so the build runs the two
    # side by side (docs/write-once.md); a row without a bake compiles before its patches.
    assert '"PYTHONDONTWRITEBYTECODE=1"' in steps[bake] and '"compile"' in steps[bake + 1]
    old_steps = [line for line in (OLD / "Dockerfile").read_text().splitlines() if line.startswith("RUN")]
    compile_step = next(i for i, step in enumerate(old_steps) if '"compile"' in step)
    assert all(compile_step < i for i, step in enumerate(old_steps) if "apply_patch.py" in step)

    patch = lambda distribution: render.RenderedPatch(distribution, "1", "0001-x.patch", "p", "t", "0" * 64, ())
    sglang, flashinfer = patch("sglang"), patch("flashinfer-python")
    assert render.patch_runs([flashinfer, sglang], bake=True) == ([flashinfer], [sglang])
    assert render.patch_runs([flashinfer, sglang], bake=False) == ([flashinfer, sglang], [])


@pytest.mark.parametrize("text", ["{", '{"serve": {}, "target_arch": ["12.0"]}'])
def test_a_bake_json_it_cannot_read_is_one_line(tmp_path, capsys, text):
    (tmp_path / "bake.json").write_text(text)
    assert flashinfer_bake.main(["--inputs", str(tmp_path / "bake.json")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("flashinfer_bake: error: ") and error.count("\n") == 1


def test_seeding_copies_what_the_cache_lacks_and_keeps_what_it_has(tmp_path):
    seed = tmp_path / "seed"
    ops = seed.joinpath(*flashinfer_bake.CACHE_TREE, "0.7.2", "120f", "cached_ops")
    for module in ("pcie_ipc_comm", "trtllm_comm"):
        (ops / module).mkdir(parents=True)
        (ops / module / f"{module}.so").write_bytes(b"baked " + module.encode())
        os.utime(ops / module / f"{module}.so", (1767225600, 1767225600))
    workspace = tmp_path / "cache" / "flashinfer"
    kept = workspace.joinpath(*flashinfer_bake.CACHE_TREE, "0.7.2", "120f", "cached_ops", "trtllm_comm")
    kept.mkdir(parents=True)
    (kept / "trtllm_comm.so").write_bytes(b"built on this host")
    assert flashinfer_bake.seed_cache(workspace, seed) == ["pcie_ipc_comm"]
    copied = kept.parent / "pcie_ipc_comm" / "pcie_ipc_comm.so"
    assert copied.read_bytes() == b"baked pcie_ipc_comm" and copied.stat().st_mtime == 1767225600
    assert (kept / "trtllm_comm.so").read_bytes() == b"built on this host"
    assert not list(kept.parent.glob("*.seeding"))
    assert flashinfer_bake.seed_cache(workspace, seed) == []
    assert flashinfer_bake.seed_cache(workspace, tmp_path / "no-seed") == []


# --- the compiler checks -------------------------------------------------------------------------


class Facts(Environment):
    """The stack description and the torch facts a check reads, with site-packages where given."""

    def __init__(self, info: dict, cuda: str = "13.0", site: Path | None = None):
        super().__init__({"stack": "s", "target_arch": ["12.0"], **info})
        self._cuda, self._site = cuda, site

    def torch_facts(self) -> dict:
        return {"cuda": self._cuda}

    def site_packages(self) -> Path:
        return self._site or Path("/nonexistent")


def test_compile_checks_skip_a_stack_without_the_nvcc_wheel():
    results = toolchain.run(Facts({"distributions": {"torch": "2.9.1"}}))
    assert [(r.check, r.status) for r in results] == [("compile.nvcc", report.SKIP), ("compile.flashinfer-jit", report.SKIP)]
    assert "pins no nvidia-cuda-nvcc" in results[0].detail


def test_compile_checks_fail_when_the_pinned_nvcc_is_not_installed():
    results = toolchain.run(Facts({"distributions": {"nvidia-cuda-nvcc": "13.0.88"}}))
    assert [r.status for r in results] == [report.FAIL, report.FAIL]
    assert "nvidia/cu13/bin/nvcc is not in site-packages" in results[0].detail


COMPILER_WHEELS = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-nvvm": "13.0.88",
                   "nvidia-cuda-runtime": "13.0.96"}


@pytest.fixture(scope="module")
def compiler_site(tmp_path_factory) -> Path:
    """The CUDA 13.0 compiler wheels the stack pins, unpacked as pip would into site-packages."""
    if shutil.which("gcc") is None:
        pytest.skip("nvcc needs a host compiler (gcc)")
    from builder.patches import patch_series

    site = tmp_path_factory.mktemp("site")
    for name, version in COMPILER_WHEELS.items():
        patch_series.unpack(patch_series.fetch_wheel(name, version), site)
    for tool in (site / "nvidia" / "cu13" / "bin").iterdir():
        tool.chmod(0o755)  # wheel RECORDs keep no modes; pip sets them from the zip's
    (site / "nvidia" / "cu13" / "nvvm" / "bin" / "cicc").chmod(0o755)
    return site


@pytest.mark.network
def test_the_nvcc_wheel_compiles_a_kernel_for_sm120(compiler_site):
    results = toolchain.run(Facts({"distributions": {"nvidia-cuda-nvcc": "13.0.88"}}, site=compiler_site))
    nvcc = results[0]
    assert nvcc.status == report.PASS, nvcc.detail
    assert nvcc.detail == "nvcc 13.0 (runtime 13.0) compiled a kernel to sm_120 cubins"
    assert results[1].status == report.SKIP and "flashinfer-python is not part of this stack" in results[1].detail


@pytest.mark.network
def test_an_nvcc_of_another_minor_than_the_runtime_fails(compiler_site):
    nvcc = toolchain.run(Facts({"distributions": {"nvidia-cuda-nvcc": "13.0.88"}}, cuda="13.1", site=compiler_site))[0]
    assert nvcc.status == report.FAIL
    assert nvcc.detail.startswith("nvcc is release 13.0, the CUDA runtime 13.1")


SHT_NOBITS = 8  # a section that takes no bytes in the file


def home_and_kernel(compiler_site: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A CUDA_HOME assembled over the compiler wheels, and a small kernel's source beside it."""
    home = cuda_home.assemble(tmp_path / "cuda", compiler_site / "nvidia" / "cu13")
    source = tmp_path / "k.cu"
    source.write_text(toolchain.KERNEL)
    return home, source


@pytest.mark.network
def test_cuda_home_over_the_wheels_links_a_library_for_sm120(compiler_site, tmp_path):
    home, source = home_and_kernel(compiler_site, tmp_path)
    assert cuda_home.assemble(tmp_path / "cuda", compiler_site / "nvidia" / "cu13") == home  # again: unchanged
    library = tmp_path / "k.so"
    # FlashInfer's link line (flashinfer/jit/cpp_ext.py): -L lib64 -L lib64/stubs -lcudart -lcuda.
    subprocess.run([str(home / "bin" / "nvcc"), "-arch=sm_120", "-shared", "-Xcompiler", "-fPIC", str(source),
                    "-o", str(library), f"-L{home}/lib64", f"-L{home}/lib64/stubs", "-lcudart", "-lcuda"],
                   check=True, capture_output=True)
    with elf.ElfFile(str(library)) as obj:
        assert {c.name for c in obj.device_code() if c.kind == "sass"} == {"sm_120"}
        assert "libcudart.so.13" in obj.needed
    with elf.ElfFile(str(home / "lib64" / "stubs" / "libcuda.so")) as stub:
        assert stub.soname == "libcuda.so.1"


@pytest.mark.network
def test_the_cuda_home_nvcc_writes_the_same_object_from_two_processes(compiler_site, tmp_path):
    """The wheel's nvcc writes its pid into the object; the CUDA_HOME's launcher takes it out."""
    home, source = home_and_kernel(compiler_site, tmp_path)

    def compiled(nvcc: Path) -> bytes:
        subprocess.run([str(nvcc), "-arch=sm_120", "-c", str(source), "-o", str(tmp_path / "k.o")],
                       check=True, capture_output=True)
        return (tmp_path / "k.o").read_bytes()

    assert compiled(home / "bin" / "nvcc") == compiled(home / "bin" / "nvcc")
    real = compiler_site / "nvidia" / "cu13" / "bin" / "nvcc"
    assert compiled(real) != compiled(real)  # the wheel's own nvcc: each run its own pid


@pytest.mark.network
def test_the_cuda_home_ptxas_runs_in_threads_and_makes_the_same_machine_code(compiler_site, tmp_path):
    """The launcher passes ptxas its thread count: each section of the cubin is what one thread
    makes, except the note where ptxas records its options."""
    home, source = home_and_kernel(compiler_site, tmp_path)

    def sections(nvcc: Path, name: str) -> dict[str, bytes]:
        cubin = tmp_path / name
        subprocess.run([str(nvcc), "-arch=sm_120", "-cubin", str(source), "-o", str(cubin)],
                       check=True, capture_output=True)
        data = cubin.read_bytes()
        with elf.ElfFile(str(cubin)) as obj:
            return {s.name: data[s.offset:s.offset + s.size] for s in obj.sections if s.type != SHT_NOBITS}

    threaded = sections(home / "bin" / "nvcc", "threaded.cubin")
    alone = sections(compiler_site / "nvidia" / "cu13" / "bin" / "nvcc", "alone.cubin")
    note = ".note.nv.tkinfo"
    assert f"-split-compile {stable_nvcc.PTXAS_THREADS} ".encode() in threaded[note]
    assert b"split-compile" not in alone[note]
    assert {name: code for name, code in threaded.items() if name != note} == \
        {name: code for name, code in alone.items() if name != note}
    assert any(name.startswith(".text.") for name in alone)
