"""The in-image smoke checks run for real against a venv holding the real stack
(torch 2.9.1 CUDA 12.8 build, sgl-kernel 0.3.21, flashinfer 0.6.4, sglang 0.5.9),
with planted faults: each must be caught by the check named for it."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("SMOKE_TEST_VENV", Path.home() / ".cache" / "builder" / "smoke-venv-cu128"))
PYTHON = VENV / "bin" / "python"
COMPLETE = VENV / ".filled"  # written once every install below has finished
WHEELS = Path(os.environ.get("SMOKE_WHEEL_CACHE", Path.home() / ".cache" / "builder" / "wheels"))
# What the venv holds: the previous deployment stack as the default index ships it, plus
# what `import sglang.srt.server_args` needs (sglang and flashinfer without their pins).
STACK_WHEELS = ["torch==2.9.1", "torchvision==0.24.1"]
NO_DEPS = ["sgl-kernel==0.3.21", "flashinfer-python==0.6.4", "flashinfer-cubin==0.6.4",
           "sglang==0.5.9"]
SERVER_ARGS_DEPS = [
    "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0", "click", "einops", "ninja", "numpy",
    "nvidia-ml-py", "packaging>=24.2", "requests", "tabulate", "tqdm", "psutil", "pydantic",
    "orjson", "transformers==4.57.1", "msgspec", "pybase64", "partial_json_parser", "pyzmq",
    "fastapi", "uvicorn", "uvloop", "aiohttp", "pillow", "setproctitle", "prometheus-client",
    "interegular", "openai==2.6.1", "openai-harmony==0.0.4", "sentencepiece", "tiktoken",
    "ipython", "blobfile==3.0.0", "huggingface_hub", "dill", "torch==2.9.1",
    "torchvision==0.24.1"]

pytestmark = pytest.mark.network


def ensure_venv() -> None:
    """Create the stack venv (about 10 GB) for this module's tests. uv fills it in about a minute where
    pip took about six; with no cache it leaves no second copy of the wheels behind. The marker goes in
    last: a run killed while filling it (a full disk, ^C) leaves a venv that the next run makes again
    instead of testing against (it once lacked tqdm, and four tests failed on the venv, not the code)."""
    if COMPLETE.exists() or ("SMOKE_TEST_VENV" in os.environ and PYTHON.exists()):  # the caller's venv: as given
        return
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    install = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--no-cache", "--python", str(PYTHON)]
    subprocess.run(install + STACK_WHEELS, check=True)
    subprocess.run(install + ["--no-deps"] + NO_DEPS, check=True)
    subprocess.run(install + SERVER_ARGS_DEPS, check=True)
    COMPLETE.touch()


def installed(name: str) -> str:
    done = subprocess.run([str(PYTHON), "-c", "import importlib.metadata as m, sys; "
                           "print(m.version(sys.argv[1]))", name],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def venv():
    ensure_venv()
    yield PYTHON
    # About 10 GB: left for the next run it would stand beside that run's verify storages, the suite's
    # disk peak (test_identity_real). A venv named by SMOKE_TEST_VENV is the caller's and stays.
    if "SMOKE_TEST_VENV" not in os.environ:
        shutil.rmtree(VENV, ignore_errors=True)


def site_packages() -> Path:
    return next((VENV / "lib").glob("python3.*/site-packages"))


RENDERED = REPO / "images" / "sglang-0.5.9-cu128-local" / "stack.json"


def make_stack(tmp_path: Path, **changes) -> Path:
    """The rendered cu128 stack's description (every serve profile, explicit switches included), pointed
    at the test venv's distributions."""
    info = json.loads(RENDERED.read_text())
    info.update({
        "stack": "host-cu128", "python": "3.11", "venv": str(VENV),
        "distributions": {name: installed(name) for name in
                          ("torch", "sgl-kernel", "flashinfer-python", "flashinfer-cubin",
                           "sglang")},
        "patches": [],
    })
    info.update(changes)
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(info))
    return path


def smoke(stack: Path, *only: str, site: Path | None = None, extra=()) -> tuple[int, dict]:
    env = dict(os.environ, BUILDER_STACK_JSON=str(stack))
    env.pop("PYTHONPATH", None)
    if site is not None:
        env["PYTHONPATH"] = str(site)  # planted packages shadow the venv's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO)]))  # builder.runtime
    done = subprocess.run([str(PYTHON), "-m", "builder.runtime.smoke", "--json", "--only", *only, *extra],
                          capture_output=True, text=True, env=env, timeout=1200)
    report = json.loads(done.stdout)
    return done.returncode, {row["check"]: row for row in report["results"]}


def status(rows: dict, check: str) -> str:
    return rows[check]["status"]


# -- the healthy stack -------------------------------------------------------

def test_real_stack_passes_without_gpu(venv, tmp_path):
    code, rows = smoke(make_stack(tmp_path), "versions", "abi", "entrypoint", "gpu")
    failures = {name: row["detail"] for name, row in rows.items() if row["status"] == "fail"}
    assert failures == {} and code == 0
    assert status(rows, "abi.undefined-symbols.sgl-kernel") == "pass"
    assert status(rows, "abi.needed-libs.sgl-kernel") == "pass"
    assert "libcuda.so.1" in rows["abi.needed-libs.sgl-kernel"]["detail"]
    assert "--tp-size 8" in rows["entrypoint.baseline"]["detail"]
    assert "--speculative-draft-model-path" in rows["entrypoint.eagle3"]["detail"]
    # The fused paths are explicit switches, and SGLang's own parser takes them in every profile that sets them.
    for mode in ("baseline-fusion", "eagle3-fusion"):
        assert "--enable-flashinfer-allreduce-fusion --enable-torch-symm-mem" in rows[f"entrypoint.{mode}"]["detail"]
    assert "--enable-flashinfer-allreduce-fusion" not in rows["entrypoint.baseline"]["detail"]
    assert {status(rows, name) for name in rows if name.startswith("gpu.")} == {"skip"}
    assert "no GPU visible" in rows["gpu.matmul"]["detail"]


def test_imports_of_the_real_stack(venv, tmp_path):
    code, rows = smoke(make_stack(tmp_path), "imports")
    assert code == 0
    assert status(rows, "imports.torch") == "pass"
    assert status(rows, "imports.sglang.srt.server_args") == "pass"
    # Without a GPU container the driver's libcuda.so.1 is absent: skipped, and said so.
    assert status(rows, "imports.sgl_kernel") == "skip"
    assert "libcuda.so.1" in rows["imports.sgl_kernel"]["detail"]


# -- planted faults ----------------------------------------------------------

def test_version_mismatch_fails_versions(venv, tmp_path):
    pins = {"torch": "2.8.0", "sgl-kernel": installed("sgl-kernel")}
    code, rows = smoke(make_stack(tmp_path, distributions=pins, cuda="13.0.1"), "versions")
    assert code == 1
    assert rows["versions.torch"]["detail"] == "torch 2.9.1 installed, stack pins 2.8.0"
    assert status(rows, "versions.sgl-kernel") == "pass"
    assert "built for CUDA 12.8; the stack needs CUDA 13.0" in rows["versions.torch-cuda"]["detail"]
    assert "another major than 13" in rows["versions.cuda-runtime"]["detail"]


def test_missing_target_architecture_fails_arch(venv, tmp_path):
    code, rows = smoke(make_stack(tmp_path, target_arch=["10.3"]), "arch")
    assert code == 1
    assert status(rows, "arch.sgl-kernel") == "fail"
    assert "no code for sm_103" in rows["arch.sgl-kernel"]["detail"]
    assert status(rows, "arch.flashinfer") == "pass"  # flashinfer-cubin has sm_103a


def test_blackwell_target_in_sgl_kernel_but_not_in_flashinfer_cubin(venv, tmp_path):
    # Without the matrix's declaration that flashinfer compiles SM120 code at first start:
    code, rows = smoke(make_stack(tmp_path, target_arch=["12.0"], jit_device_code={}), "arch")
    assert status(rows, "arch.sgl-kernel") == "pass"
    assert "sm_120a" in rows["arch.sgl-kernel"]["detail"]
    # flashinfer-cubin 0.6.4 ships SM100-family kernels only: SM120 needs flashinfer-jit-cache.
    assert status(rows, "arch.flashinfer") == "fail" and code == 1
    assert "no prebuilt device code for sm_120" in rows["arch.flashinfer"]["detail"]
    # With it (as the rendered stack declares), the same finding is a skip that says why.
    code, rows = smoke(make_stack(tmp_path, target_arch=["12.0"]), "arch")
    assert status(rows, "arch.flashinfer") == "skip" and code == 0


# A stand-in "sgl-kernel" distribution built here: a real extension linked
# against the venv's libc10, loaded the way torch.ops.load_library loads one.
EXTENSION_SOURCE = """
#include <string>
namespace c10 { namespace detail {
[[noreturn]] void torchCheckFail(const char* func, const char* file, unsigned int line,
                                 const std::string& msg);
} }
extern "C" void smoke_probe(int fail) {
  if (fail) c10::detail::torchCheckFail("probe", "probe.cpp", 1, std::string("planted"));
}
"""


def plant_extension(site: Path, *, cxx11_abi: int, helper: bool = True) -> Path:
    """site/sgl_kernel with common_ops.so (needing libc10 and, via $ORIGIN, a helper library)."""
    torch_lib = site_packages() / "torch" / "lib"
    package = site / "sgl_kernel"
    libs = site / "sgl_kernel.libs"
    package.mkdir(parents=True)
    libs.mkdir()
    (site / "probe.cpp").write_text(EXTENSION_SOURCE)
    (site / "helper.c").write_text("int smoke_helper(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(libs / "libsmokehelper.so"),
                    str(site / "helper.c")], check=True)
    subprocess.run(["g++", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}",
                    "-o", str(package / "common_ops.so"), str(site / "probe.cpp"),
                    "-Wl,--no-as-needed", f"-L{libs}", "-lsmokehelper",
                    f"-L{torch_lib}", "-lc10", "-Wl,-rpath,$ORIGIN/../sgl_kernel.libs"],
                   check=True)
    (package / "__init__.py").write_text(textwrap.dedent("""
        import ctypes, os
        import torch
        ctypes.CDLL(os.path.join(os.path.dirname(__file__), "common_ops.so"))
        """))
    info = site / "sgl_kernel-0.3.21.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sgl-kernel\nVersion: 0.3.21\n")
    (info / "RECORD").write_text("sgl_kernel/__init__.py,,\nsgl_kernel/common_ops.so,,\n"
                                 "sgl_kernel.libs/libsmokehelper.so,,\n"
                                 "sgl_kernel-0.3.21.dist-info/METADATA,,\n")
    return site


def test_planted_extension_healthy_passes(venv, tmp_path):
    site = plant_extension(tmp_path / "site", cxx11_abi=1)
    code, rows = smoke(make_stack(tmp_path), "imports", "abi", site=site)
    assert status(rows, "imports.sgl_kernel") == "pass"
    for check in ("abi.needed-libs.sgl-kernel", "abi.undefined-symbols.sgl-kernel", "abi.cxx11"):
        assert status(rows, check) == "pass", rows[check]
    assert code == 0


def test_extension_built_against_another_torch_abi(venv, tmp_path):
    site = plant_extension(tmp_path / "site", cxx11_abi=0)
    code, rows = smoke(make_stack(tmp_path), "imports", "abi", site=site)
    assert code == 1
    symbol = "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"
    assert "undefined symbol" in rows["imports.sgl_kernel"]["detail"]
    assert symbol in rows["imports.sgl_kernel"]["detail"]
    assert symbol in rows["abi.undefined-symbols.sgl-kernel"]["detail"]
    assert status(rows, "abi.cxx11") == "fail"
    assert "sgl_kernel/common_ops.so uses _GLIBCXX_USE_CXX11_ABI=0" in rows["abi.cxx11"]["detail"]
    assert rows["abi.cxx11"]["detail"].startswith("torch has _GLIBCXX_USE_CXX11_ABI=1")


def test_removed_shared_library_fails_needed_libs(venv, tmp_path):
    site = plant_extension(tmp_path / "site", cxx11_abi=1)
    (site / "sgl_kernel.libs" / "libsmokehelper.so").unlink()
    code, rows = smoke(make_stack(tmp_path), "imports", "abi", site=site)
    assert code == 1
    assert rows["abi.needed-libs.sgl-kernel"]["detail"] == (
        "1 needed libraries not found: sgl_kernel/common_ops.so needs libsmokehelper.so")
    assert "libsmokehelper.so: cannot open shared object file" in \
        rows["imports.sgl_kernel"]["detail"]
    assert status(rows, "abi.needed-libs.torch") == "pass"


ORIGINAL = "TABLE = {\n    9: 1,\n    10: 2,\n}\n"
PATCHED = "TABLE = {\n    9: 1,\n    10: 2,\n    # SM120: mirrors SM100\n    12: 2,\n}\n"
PATCH = textwrap.dedent("""\
    Subject: planted: a capability-12 row

    --- a/sglang/srt/smoke_planted_table.py
    +++ b/sglang/srt/smoke_planted_table.py
    @@ -2,3 +2,5 @@
         9: 1,
         10: 2,
    +    # SM120: mirrors SM100
    +    12: 2,
     }
    """)


def plant_patched_module(tmp_path: Path, content: str) -> tuple[Path, dict]:
    site = tmp_path / "site"
    module = site / "sglang" / "srt" / "smoke_planted_table.py"
    module.parent.mkdir(parents=True)
    module.write_text(content)
    py_compile.compile(str(module), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    patch = tmp_path / "0001-planted.patch"
    patch.write_text(PATCH)
    entry = {"package": "sglang", "version": "0.5.9", "name": "0001-planted.patch",
             "sha256": "0" * 64, "path": str(patch),
             "files": ["sglang/srt/smoke_planted_table.py"]}
    return site, entry


def test_applied_patch_passes(venv, tmp_path):
    site, entry = plant_patched_module(tmp_path, PATCHED)
    code, rows = smoke(make_stack(tmp_path, patches=[entry]), "patches", site=site)
    assert rows["patches.sglang/0001-planted.patch"] == {
        "check": "patches.sglang/0001-planted.patch", "status": "pass",
        "detail": "1 hunks in 1 files present; bytecode current"}
    assert code == 0


def test_reverted_patch_fails_patches(venv, tmp_path):
    site, entry = plant_patched_module(tmp_path, ORIGINAL)
    code, rows = smoke(make_stack(tmp_path, patches=[entry]), "patches", site=site)
    assert code == 1
    detail = rows["patches.sglang/0001-planted.patch"]["detail"]
    assert "sglang/srt/smoke_planted_table.py hunk #1 (@@ -2,3 +2,5 @@) is not in" in detail


def test_stale_bytecode_fails_patches(venv, tmp_path):
    site, entry = plant_patched_module(tmp_path, ORIGINAL)
    (site / "sglang" / "srt" / "smoke_planted_table.py").write_text(PATCHED)  # pyc now stale
    code, rows = smoke(make_stack(tmp_path, patches=[entry]), "patches", site=site)
    assert code == 1
    assert "compiled from other source (stale hash)" in \
        rows["patches.sglang/0001-planted.patch"]["detail"]


def test_entrypoint_flag_sglang_rejects(venv, tmp_path):
    modes = {"broken": {"args": {"tp_size": 8, "no_such_option": 1}, "env": {}, "reasons": {},
                        "requires_draft_model": False, "reference": {"own": None, "replaced": None}}}
    stack = make_stack(tmp_path, serve={"env": {}, "cache_dir": "/cache", "modes": modes})
    code, rows = smoke(stack, "entrypoint")
    assert code == 1
    assert "unrecognized arguments: --no-such-option 1" in rows["entrypoint.broken"]["detail"]


def test_planted_gpu_expectation_still_skips_without_gpu(venv, tmp_path):
    code, rows = smoke(make_stack(tmp_path), "gpu", extra=("--gpu-expect-offset", "1"))
    assert code == 0 and {row["status"] for row in rows.values()} == {"skip"}
