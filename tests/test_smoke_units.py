"""Pieces of the smoke program that need no stack venv: the patch reader, the
library resolver on freshly compiled objects, the program's bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builder.runtime import apply_patch
from builder.runtime.binaries import loader as library_loader
from builder.runtime.smoke import abi, arch, env, imports, patches
from checkouts import in_image_tools


def test_patch_new_side_and_a_removed_line_that_looks_like_a_header():
    text = ("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n a = 1\n--- old = 2\n+new = 2\n"
            " c = 3\n--- a/pkg/other.py\n+++ b/pkg/other.py\n@@ -5 +5,2 @@\n x\n+y\n")
    first, second = apply_patch.parse_patch(text, "demo.patch")
    assert first.path == "pkg/mod.py" and first.hunks[0].new_side == ("a = 1", "new = 2", "c = 3")
    assert second.path == "pkg/other.py" and second.hunks[0].new_side == ("x", "y")


def test_find_block_needs_consecutive_lines():
    lines = ["a", "b", "c", "d"]
    assert patches.find_block(lines, ["b", "c"]) == 1
    assert patches.find_block(lines, ["b", "d"]) == -1
    assert patches.find_block(lines, ["c  "]) == 2  # trailing whitespace ignored


def test_child_reason_prefers_the_loader_message():
    child = env.ChildResult(1, "", "Traceback\n- ImportError: libx.so.1: cannot open shared "
                                         "object file: No such file\n- ModuleNotFoundError: y\n")
    assert child.reason() == "ImportError: libx.so.1: cannot open shared object file: No such file"
    assert env.ChildResult(-11, "", "").reason() == "killed by SIGSEGV"
    assert env.ChildResult(None, "", "timed out after 5 s").reason() == "timed out after 5 s"


def compile_library(directory: Path, name: str, *link: str) -> Path:
    source = directory / f"{name}.c"
    source.write_text(f"int {name.replace('-', '_')}(void) {{ return 0; }}\n")
    target = directory / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), str(source),
                    "-Wl,--no-as-needed", *link], check=True)
    return target


def test_loader_follows_origin_runpath_and_reports_the_missing(tmp_path):
    libs = tmp_path / "pkg.libs"
    libs.mkdir()
    compile_library(libs, "leaf")
    top = compile_library(tmp_path, "top", f"-L{libs}", "-lleaf", "-Wl,-rpath,$ORIGIN/pkg.libs")
    loader = library_loader.Loader(ld_library_path="")
    loaded, missing = loader.closure(str(top))
    assert loaded["libleaf.so"] == str(libs / "libleaf.so") and missing == []
    assert loaded["libc.so.6"].endswith("/libc.so.6")
    (libs / "libleaf.so").unlink()
    loaded, missing = library_loader.Loader(ld_library_path="").closure(str(top))
    assert missing == [(str(top), "libleaf.so")]


def test_loader_prefers_an_already_loaded_soname(tmp_path):
    compile_library(tmp_path, "leaf")
    top = compile_library(tmp_path, "top", f"-L{tmp_path}", "-lleaf")  # no rpath at all
    assert library_loader.Loader(ld_library_path="").closure(str(top))[1] == [(str(top), "libleaf.so")]
    loader = library_loader.Loader(preloaded={"libleaf.so": str(tmp_path / "libleaf.so")},
                               ld_library_path="")
    assert loader.closure(str(top))[1] == []


def run_smoke(tmp_path: Path, *args: str, stack: str | None = None) -> subprocess.CompletedProcess:
    """The smoke program as the image runs it: a module found through PYTHONPATH, nothing else of builder."""
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(in_image_tools(tmp_path))}
    if stack:
        environment["BUILDER_STACK_JSON"] = stack
    return subprocess.run([sys.executable, "-m", "builder.runtime.smoke", *args], capture_output=True, text=True,
                          env=environment, cwd="/")


def test_missing_stack_description_is_exit_2_with_one_line(tmp_path):
    done = run_smoke(tmp_path, stack=str(tmp_path / "absent.json"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("smoke: error: cannot read the stack description: ")
    assert "absent.json" in done.stderr and len(done.stderr.splitlines()) == 1


def test_wrong_schema_is_exit_2(tmp_path):
    stack = tmp_path / "stack.json"
    stack.write_text(json.dumps({"schema": 9}))
    done = run_smoke(tmp_path, "--only", "patches", stack=str(stack))
    assert done.returncode == 2
    assert "unsupported stack.json schema 9" in done.stderr


def test_unknown_check_name_is_a_usage_error(tmp_path):
    done = run_smoke(tmp_path, "--only", "vibes")
    assert done.returncode == 2 and "invalid choice: 'vibes'" in done.stderr


def test_runs_as_a_module_from_the_image_layout(tmp_path):
    stack = tmp_path / "stack.json"
    stack.write_text(json.dumps({"schema": 2, "stack": "bare", "patches": [],
                                 "serve": {"modes": {}}}))
    done = run_smoke(tmp_path, "--only", "patches", "entrypoint", "--json", stack=str(stack))
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"]
    assert [(row["check"], row["status"]) for row in rows] == [("patches", "skip"),
                                                               ("entrypoint", "skip")]


def test_checks_run_side_by_side_and_report_in_their_order(monkeypatch):
    """The first check finishes last, yet comes first; both ran at once (each waits for the other)."""
    import threading

    from builder.runtime.smoke import program, report as smoke_report

    both_started = threading.Barrier(2, timeout=10)

    def slow(env):
        both_started.wait()
        threading.Event().wait(0.2)
        return [smoke_report.passed("slow", "finished second")]

    def quick(env):
        both_started.wait()
        return [smoke_report.passed("quick", "finished first")]

    monkeypatch.setattr(program, "CHECKS", {"slow": slow, "quick": quick})
    results = program.run_checks(env=None, names=["slow", "quick"])
    assert [result.check for result in results] == ["slow", "quick"]


@pytest.mark.parametrize("kernel", ["sgl-kernel", "sglang-kernel"])
def test_sgl_kernel_is_checked_under_the_name_the_stack_pins(kernel, monkeypatch):
    """sgl-kernel became sglang-kernel (0.4): the imports, abi and arch checks follow the stack's pin."""
    environment = env.Environment({"stack": "s", "patches": [], "target_arch": ["12.0"], "distributions": {
        "torch": "2.14.1", kernel: "0.4.10", "flashinfer-python": "0.7.2", "sglang": "0.5.23"}})
    assert ("sgl_kernel", kernel) in imports.core_modules(environment)
    assert abi.library_distributions(environment) == ("torch", kernel, "flashinfer-python", "flashinfer-jit-cache")
    monkeypatch.setattr(env.Environment, "distribution_files", lambda self, name: [])
    result = arch.run(environment)[0]
    assert result.check == "arch.sgl-kernel"
    assert result.status == "fail" and result.detail == f"{kernel} has no common_ops library with device code"


def test_both_string_abis_inside_one_object_are_not_a_mismatch_with_torch():
    """sglang-kernel 0.4.10's infllm_ops uses the old string's empty representation and new-ABI strings;
    what it passes to torch is new-ABI, so nothing crosses with the other ABI."""
    infllm = ["_ZNSs4_Rep20_S_empty_rep_storageE",
              "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm",
              "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"]
    assert abi.string_abis(infllm) == {0, 1}
    assert abi.torch_facing_abis(infllm) == {1}
    # The planted fault of test_smoke_checks: torch's check helper called with the old string.
    assert abi.torch_facing_abis(["_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"]) == {0}
