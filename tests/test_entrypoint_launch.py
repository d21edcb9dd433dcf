"""The launch command and environment come from the stack's serve profile; bad input exits 2."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys

import pytest

from builder.runtime import stackinfo
from builder.runtime.serve import api_key, launch
from builder.runtime.serve.errors import UsageError
from checkouts import in_image_tools
from standin_sglang import harness

PY = "/opt/venv/bin/python"


@pytest.fixture
def stack():
    return stackinfo.load(str(harness.FIXTURE))


def plan_for(stack, **options):
    options.setdefault("mode", "baseline")
    options.setdefault("model", "/models/M")
    return launch.build_plan(stack, launch.ServeOptions(**options), PY)


def test_baseline_command_is_the_profile_in_order(stack):
    plan = plan_for(stack)
    assert plan.command == (
        PY, "-m", "sglang.launch_server", "--model-path", "/models/M",
        "--tp-size", "8", "--attention-backend", "flashinfer", "--disable-custom-all-reduce",
        "--host", "0.0.0.0", "--port", "30000",
    )  # fmt: skip
    assert plan.gpus_needed == 8


def test_eagle3_adds_the_speculative_settings_and_draft(stack):
    plan = plan_for(stack, mode="eagle3", draft_model="/models/D")
    command = list(plan.command)
    for flag, value in [
        ("--speculative-algorithm", "EAGLE3"),
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-draft-tokens", "4"),
        ("--speculative-draft-model-path", "/models/D"),
        ("--attention-backend", "flashinfer"),
    ]:
        assert command[command.index(flag) + 1] == value


def test_user_options_replace_profile_values_without_duplicates(stack):
    plan = plan_for(
        stack, tp=4, port=31000, host="127.0.0.1", api_key=api_key.ApiKey("secret", None),
        nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000",
    )  # fmt: skip
    command = list(plan.command)
    for flag, value in [
        ("--tp-size", "4"), ("--port", "31000"), ("--host", "127.0.0.1"),
        ("--nnodes", "2"), ("--node-rank", "1"), ("--dist-init-addr", "10.0.0.1:5000"),
    ]:  # fmt: skip
        assert command.count(flag) == 1
        assert command[command.index(flag) + 1] == value
    assert plan.gpus_needed == 2  # tp 4 split over 2 nodes
    # The key is on no command line: the keyed launcher adds it inside the server's process.
    assert command[1:3] == ["-m", "builder.runtime.serve.keyed_launch"]
    assert "--api-key" not in command and "secret" not in command and "secret" not in json.dumps(plan.env)
    assert plan.api_key == "secret" and "secret" not in repr(plan)
    assert launch.child_environment(plan, {"PATH": "/bin"})["SERVE_API_KEY"] == "secret"


def test_extra_arguments_pass_through_unchanged_at_the_end(stack):
    extra = ("--mem-fraction-static", "0.85", "--cuda-graph-max-bs", "16", "--trust-remote-code")
    plan = plan_for(stack, extra_args=extra)
    assert plan.command[-len(extra) :] == extra


@pytest.mark.parametrize(
    "extra, owner",
    [
        (("--port", "31000"), "--port"),
        (("--tp-size=4",), "--tp"),
        (("--tensor-parallel-size", "4"), "--tp"),
        (("--speculative-draft-model-path", "/d"), "--draft-model"),
        (("--model", "/m"), "--model"),
    ],
)
def test_flags_the_entrypoint_owns_are_refused_after_the_separator(stack, extra, owner):
    with pytest.raises(UsageError, match=f"use its {owner} option"):
        plan_for(stack, extra_args=extra)


def test_draft_model_rules(stack):
    with pytest.raises(UsageError, match="mode 'eagle3' needs --draft-model"):
        plan_for(stack, mode="eagle3")
    with pytest.raises(UsageError, match="mode 'baseline' takes no draft model"):
        plan_for(stack, draft_model="/models/D")
    with pytest.raises(UsageError, match=r"unknown mode 'turbo'; this stack has: baseline, eagle3"):
        plan_for(stack, mode="turbo")


def test_multi_node_needs_its_companions(stack):
    with pytest.raises(UsageError, match="--node-rank needs --nnodes"):
        plan_for(stack, node_rank=1)
    with pytest.raises(UsageError, match="--dist-init-addr"):
        plan_for(stack, nnodes=2, node_rank=1)


def test_environment_profile_caches_and_caller_precedence(stack):
    plan = plan_for(stack, cache_dir="/mnt/cache")
    assert plan.env == {
        "CUDA_CACHE_PATH": "/mnt/cache/cuda-compute",
        "FLASHINFER_WORKSPACE_BASE": "/mnt/cache/flashinfer",
        "NCCL_P2P_DISABLE": "1",
        "SGLANG_DISABLE_CUDNN_CHECK": "1",
        "TRITON_CACHE_DIR": "/mnt/cache/triton",
        "TVM_FFI_CACHE_DIR": "/mnt/cache/tvm-ffi",
    }
    child = launch.child_environment(plan, {"NCCL_P2P_DISABLE": "0", "HOME": "/root"})
    assert child["NCCL_P2P_DISABLE"] == "0"  # the caller's -e wins over the profile
    assert child["HOME"] == "/root"
    assert child["TRITON_CACHE_DIR"] == "/mnt/cache/triton"


def test_cache_dir_defaults_to_the_stack_and_mode_env_wins_over_stack_env(stack):
    stack["serve"]["modes"]["baseline"]["env"] = {"NCCL_P2P_DISABLE": "0", "NCCL_IB_DISABLE": "1"}
    plan = plan_for(stack)
    assert plan.cache_dir == "/cache"
    assert plan.env["TVM_FFI_CACHE_DIR"] == "/cache/tvm-ffi"
    assert plan.env["NCCL_P2P_DISABLE"] == "0"
    assert plan.env["NCCL_IB_DISABLE"] == "1"


# ---- the command line, as a user meets it ----------------------------------------------------


def test_dry_run_prints_command_and_env_with_passthrough(tmp_path):
    env = harness.standin_env()
    result = harness.run_entrypoint(
        ["serve", "--mode", "eagle3", "--model", "/m", "--draft-model", "/d", "--tp", "4",
         "--dry-run", "--", "--mem-fraction-static", "0.8"],
        {**env, "SERVE_API_KEY": "k-secret"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["command"][1:3] == ["-m", "builder.runtime.serve.keyed_launch"]
    assert shown["command"][-2:] == ["--mem-fraction-static", "0.8"]
    assert shown["command"][shown["command"].index("--tp-size") + 1] == "4"
    assert "k-secret" not in result.stdout + result.stderr and "--api-key" not in shown["command"]
    assert shown["env"]["SGLANG_DISABLE_CUDNN_CHECK"] == "1"


@pytest.mark.parametrize(
    "args, message",
    [
        (["serve", "--mode", "eagle3", "--model", "/m"], "error: mode 'eagle3' needs --draft-model"),
        (["serve", "--mode", "nope", "--model", "/m"], "error: unknown mode 'nope'"),
        (["serve", "--mode", "baseline", "--model", "/m", "--", "--port", "1"], "error: --port is set by"),
        (["serve", "--mode", "baseline"], "the following arguments are required: --model"),
        (["serve", "--mode", "baseline", "--model", "/m", "--tp", "0"], "0 is not a positive integer"),
        (["serve", "--mode", "baseline", "--model", "/m", "--port", "70000"], "70000 is not a TCP port"),
        (["serve", "--mode", "baseline", "--model", "/m", "--stall-timeout", "-1"], "-1 is not a positive number"),
        (["bench", "--mode", "baseline"], "error: bench needs --model PATH to launch a server, or --url"),
        (["bench", "--mode", "baseline", "--url", "http://x", "--model", "/m"], "error: --url benchmarks"),
        (["bench", "--mode", "baseline", "--model", "/m", "--tolerance", "3"], "error: --tolerance 3.0"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(args, message):
    result = harness.run_entrypoint(args, harness.standin_env())
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_timeout_variable_exits_2(tmp_path):
    env = harness.standin_env()
    env["ENTRYPOINT_STALL_TIMEOUT"] = "five minutes"
    result = harness.run_entrypoint(["serve", "--mode", "baseline", "--model", "/m"], env)
    assert result.returncode == 2
    assert "ENTRYPOINT_STALL_TIMEOUT='five minutes' is not a positive number of seconds" in result.stderr


def test_missing_stack_description_exits_2(tmp_path):
    env = harness.standin_env(stack_json=tmp_path / "absent.json")
    result = harness.run_entrypoint(["serve", "--mode", "baseline", "--model", "/m"], env)
    assert result.returncode == 2
    assert "error: cannot read the stack description" in result.stderr
    assert "absent.json" in result.stderr


# ---- smoke and shell exec, and the image's import layout ---------------------------------------


def image_layout(tmp_path):
    return in_image_tools(tmp_path)


def test_runs_from_the_image_layout_without_the_rest_of_builder(tmp_path):
    root = image_layout(tmp_path)
    assert not (root / "builder" / "__init__.py").exists()
    env = harness.standin_env()
    env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-m", "builder.runtime.serve.entrypoint", "serve", "--mode", "baseline",
         "--model", "/m", "--dry-run"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["command"][2] == "sglang.launch_server"


def test_smoke_execs_the_smoke_program_with_arguments(tmp_path):
    root = image_layout(tmp_path)
    smoke = root / "builder" / "runtime" / "smoke" / "__main__.py"
    smoke.write_text(
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid()}))\n"
        "sys.exit(5)\n"
    )
    env = harness.standin_env()
    env["PYTHONPATH"] = str(root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder.runtime.serve.entrypoint", "smoke", "--json", "-v"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 5  # the smoke program's status, unchanged
    seen = json.loads(out)
    assert seen["argv"] == ["--json", "-v"]
    assert seen["pid"] == proc.pid  # exec: the same process, no wrapper left behind


def test_smoke_without_the_program_fails_with_its_path(tmp_path):
    root = image_layout(tmp_path)
    (root / "builder" / "runtime" / "smoke" / "__main__.py").unlink()
    env = harness.standin_env()
    env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-m", "builder.runtime.serve.entrypoint", "smoke"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"smoke checks are not installed: {root}/builder/runtime/smoke/__main__.py is missing" in result.stderr


def test_smoke_reaches_the_real_smoke_program_in_the_image_layout(tmp_path):
    root = image_layout(tmp_path)
    env = harness.standin_env()
    env["PYTHONPATH"] = str(root)
    result = subprocess.run(
        [sys.executable, "-m", "builder.runtime.serve.entrypoint", "smoke", "--help"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--only" in result.stdout  # the smoke program's own usage, reached through exec


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
def test_shell_execs_bash_with_arguments():
    proc = subprocess.Popen(
        [*harness.ENTRYPOINT, "shell", "-c", "echo $0 $$", "named"],
        env=harness.standin_env(), cwd=harness.REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.split() == ["named", str(proc.pid)]  # bash replaced the entrypoint's process


def test_help_lists_every_command():
    """Each command on a line of its own under COMMAND, with its help text: exactly these five."""
    result = harness.run_entrypoint(["--help"], harness.standin_env())
    assert result.returncode == 0
    listed = re.findall(r"^    (\w+) {2,}\S", result.stdout, re.MULTILINE)
    assert sorted(listed) == ["bench", "health", "serve", "shell", "smoke"]


RUNTIME_MODULES = sorted(p.relative_to(harness.REPO / "builder" / "runtime").as_posix()
                         for p in (harness.REPO / "builder" / "runtime").rglob("*.py"))


@pytest.mark.parametrize("name", RUNTIME_MODULES)
def test_runtime_modules_import_only_the_standard_library_and_builder_runtime(name):
    """At module level (torch and flashinfer are imported inside the GPU worker's functions only),
    with absolute imports: the image holds builder/runtime and no other part of builder."""
    source = (harness.REPO / "builder" / "runtime" / name).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            modules = [node.module]
        elif isinstance(node, ast.Try):
            assert not any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers), \
                f"{name}: import fallback"
            continue
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            assert (
                module == "builder.runtime" or module.startswith("builder.runtime.")
                if top == "builder"
                else top in sys.stdlib_module_names or top == "__future__"
            ), f"{name} imports {module}"
