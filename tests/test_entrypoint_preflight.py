"""Pre-flight: GPUs against the TP size, model paths, port, cache dir, processes holding GPUs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from builder.runtime import driver, stackinfo
from builder.runtime.serve import launch, preflight
from builder.runtime.serve.errors import PreflightError
from standin_sglang import harness

RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DRIVER_DOWN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def smi(answers: dict):
    """An injected nvidia-smi: query prefix -> (returncode, stdout); None = not installed."""

    def run(arguments):
        if answers is None:
            return None
        for prefix, (code, out) in answers.items():
            if arguments[0].startswith(prefix):
                return subprocess.CompletedProcess(arguments, code, out, "")
        raise AssertionError(f"unexpected nvidia-smi call {arguments}")

    return run


def gpu_lines(count: int) -> str:
    return "".join(f"{index}, {RTX}\n" for index in range(count))


def proc_gpus(tmp_path, count: int):
    root = tmp_path / "gpus"
    for index in range(count):
        gpu = root / f"0000:{index + 1:02x}:00.0"
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(f"Model: \t\t {RTX}\nIRQ:   \t\t 100\n")
    return str(root)


def test_nvidia_smi_is_the_first_probe(tmp_path):
    inventory = preflight.probe_gpus(smi({"--query-gpu": (0, gpu_lines(8))}), proc_gpus(tmp_path, 2))
    assert inventory == preflight.GpuInventory((RTX,) * 8, "nvidia-smi")


def test_driver_listing_when_nvidia_smi_is_missing_or_failing(tmp_path):
    proc_dir = proc_gpus(tmp_path, 8)
    assert preflight.probe_gpus(smi(None), proc_dir) == preflight.GpuInventory((RTX,) * 8, proc_dir)
    failing = smi({"--query-gpu": (9, DRIVER_DOWN)})
    assert preflight.probe_gpus(failing, proc_dir).names == (RTX,) * 8


def test_no_probe_at_all_says_what_was_tried(tmp_path):
    inventory = preflight.probe_gpus(smi({"--query-gpu": (9, DRIVER_DOWN)}), str(tmp_path / "none"))
    assert inventory.names is None
    with pytest.raises(PreflightError) as caught:
        preflight.check_gpus(8, inventory, None)
    assert str(caught.value) == (
        f"no NVIDIA GPU visible (nvidia-smi failed: {DRIVER_DOWN}; {tmp_path}/none absent); "
        "start the container with --gpus all"
    )


@pytest.mark.parametrize(
    "physical, cvd, visible",
    [
        (8, None, 8),
        (8, "0,1,2,3", 4),
        (8, "", 0),
        (8, "0,1,-1,2", 2),  # CUDA stops at the first entry it cannot use
        (8, "GPU-aaaa,GPU-bbbb", 2),
        (4, "0,1,2,3,4,5,6,7", 4),  # indices past the hardware are not devices
    ],
)
def test_cuda_visible_devices_narrows_the_count(physical, cvd, visible):
    assert preflight.visible_gpu_count(physical, cvd) == visible


def test_too_few_gpus_names_both_counts():
    inventory = preflight.GpuInventory((RTX,) * 8, "nvidia-smi")
    preflight.check_gpus(8, inventory, None)
    with pytest.raises(PreflightError) as caught:
        preflight.check_gpus(8, inventory, "0,1,2,3")
    assert str(caught.value) == (
        "tensor parallel needs 8 GPUs but 4 are visible "
        "(nvidia-smi: 8, CUDA_VISIBLE_DEVICES='0,1,2,3'); pass --gpus all, or lower --tp"
    )


def test_gpu_processes_are_parsed_with_pids():
    run = smi({"--query-compute-apps": (0, "4242, /usr/bin/python3, 81920 MiB\n77, [Not Found], 512 MiB\n")})
    assert [p.describe() for p in preflight.gpu_processes(run)] == [
        "pid 4242 (/usr/bin/python3, 81920 MiB)",
        "pid 77 ([Not Found], 512 MiB)",
    ]
    assert preflight.gpu_processes(smi({"--query-compute-apps": (0, "")})) == []
    assert preflight.gpu_processes(smi(None)) == []


def test_model_paths_must_exist_and_be_readable(tmp_path):
    model = harness.make_model(tmp_path)
    preflight.check_readable(model, "model path")
    with pytest.raises(PreflightError, match=r"model path /models/absent does not exist; mount it"):
        preflight.check_readable("/models/absent", "model path")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").symlink_to(tmp_path / "nowhere.json")  # listed, but cannot be opened
    with pytest.raises(PreflightError, match=r"draft model path .*/broken is not readable: No such file"):
        preflight.check_readable(str(broken), "draft model path")


def test_port_in_use_is_caught_and_a_free_port_passes():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PreflightError) as caught:
            preflight.check_port_free("127.0.0.1", port)
        assert str(caught.value) == (
            f"port {port} on 127.0.0.1 is already in use (an earlier server still running?)"
        )
    preflight.check_port_free("127.0.0.1", port)  # released: TIME_WAIT is no conflict
    with pytest.raises(PreflightError, match="cannot resolve --host no-such-host.invalid"):
        preflight.check_port_free("no-such-host.invalid", port)


def test_cache_dir_must_be_writable(tmp_path):
    preflight.prepare_cache_dir(str(tmp_path / "cache" / "deep"))
    assert (tmp_path / "cache" / "deep").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PreflightError, match=f"cache directory {blocker}/cache is not writable by uid {os.getuid()}: "
                       rf".* \(on the host: chown {os.getuid()}:{os.getgid()} the mounted directory, or run with --user\)"):
        preflight.prepare_cache_dir(str(blocker / "cache"))


def test_every_problem_is_reported_in_one_run(tmp_path):
    stack = stackinfo.load(str(harness.FIXTURE))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        plan = launch.build_plan(
            stack,
            launch.ServeOptions(
                mode="eagle3", model="/models/absent", draft_model=harness.make_model(tmp_path),
                host="127.0.0.1", port=port, cache_dir=str(tmp_path / "cache"),
            ),  # fmt: skip
            "python",
        )
        run = smi({"--query-gpu=driver": (0, "590.48.01\n590.48.01\n"), "--query-gpu": (0, gpu_lines(2)),
                   "--query-compute-apps": (0, "4242, python3, 81920 MiB\n")})
        report = preflight.run_preflight(plan, {}, stack["driver"], run)
    assert report.problems == (
        "tensor parallel needs 8 GPUs but 2 are visible (nvidia-smi: 2); pass --gpus all, or lower --tp",
        "model path /models/absent does not exist; mount it into the container (-v)",
        f"port {port} on 127.0.0.1 is already in use (an earlier server still running?)",
    )
    assert any("pid 4242 (python3, 81920 MiB)" in warning for warning in report.warnings)


# ---- through the entrypoint, with the stand-in nvidia-smi ------------------------------------


def test_failed_preflight_exits_3_listing_each_problem_and_starts_nothing(tmp_path):
    env = harness.standin_env(gpu_count=4)
    port = harness.free_port()
    args = harness.launch_args(tmp_path, port, model=str(tmp_path / "not-mounted"))
    result = harness.run_entrypoint(["serve", *args], env)
    assert result.returncode == 3
    assert "entrypoint: error: tensor parallel needs 8 GPUs but 4 are visible (nvidia-smi: 4)" in result.stderr
    assert f"entrypoint: error: model path {tmp_path}/not-mounted does not exist" in result.stderr
    assert "starting:" not in result.stderr
    assert not (tmp_path / "cache" / "logs").exists()


def test_lower_tp_fits_fewer_gpus(tmp_path):
    env = harness.standin_env(gpu_count=4, exit_at="1:0")
    args = harness.launch_args(tmp_path, harness.free_port())
    result = harness.run_entrypoint(["serve", *args, "--tp", "4"], env)
    assert "pre-flight passed: 4 GPU(s), 4 needed" in result.stderr
    assert result.returncode == 4  # the stand-in then leaves early, as told
    assert "error: server exited with status 0 before it was ready" in result.stderr


def test_gpu_holders_are_reported_and_repeated_when_the_start_fails(tmp_path):
    env = harness.standin_env(gpu_apps="4242,python3,81920;4343,python3,81920", exit_at="2:1")
    args = harness.launch_args(tmp_path, harness.free_port())
    result = harness.run_entrypoint(["serve", *args], env)
    assert result.returncode == 4
    assert (
        "entrypoint: warning: GPU memory is held by other processes: pid 4242 (python3, 81920 MiB), "
        "pid 4343 (python3, 81920 MiB)"
    ) in result.stderr
    assert "entrypoint: note: GPU memory was held by pid 4242 (python3, 81920 MiB)" in result.stderr


# ---- the driver against the stack CUDA's minimum ---------------------------------------------

CU130 = {"cuda": "13.0.1", "minimum": "580.82.07", "source": "NVIDIA CUDA Toolkit release notes"}
PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
                "(dvs-builder@U16-I3-B03-4-3)  Wed May 21 23:08:37 UTC 2025\nGCC version:  gcc version 12.2.0\n")


def test_driver_version_from_nvidia_smi_then_the_kernel_module(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(PROC_VERSION)
    assert driver.installed_version(smi({"--query-gpu=driver": (0, "590.48.01\n" * 8)}), str(proc)) == "590.48.01"
    assert driver.installed_version(smi(None), str(proc)) == "575.57.08"
    assert driver.installed_version(smi({"--query-gpu=driver": (9, DRIVER_DOWN)}), str(proc)) == "575.57.08"
    assert driver.installed_version(smi(None), str(tmp_path / "absent")) is None


@pytest.mark.parametrize(("installed", "refused"), [
    ("575.57.08", True), ("580.65.06", True), ("580.82.07", False), ("580.159.04", False), ("590.48.01", False),
])
def test_a_driver_older_than_the_minimum_is_refused_naming_both(installed, refused):
    problem = driver.too_old(installed, CU130)
    assert (problem is not None) == refused
    if refused:
        assert problem == (f"NVIDIA driver {installed} is older than 580.82.07, the minimum for CUDA 13.0.1 "
                           "(NVIDIA CUDA Toolkit release notes); upgrade the host's driver")


def test_preflight_refuses_an_old_driver_and_warns_when_it_cannot_tell(tmp_path):
    stack = stackinfo.load(str(harness.FIXTURE))
    plan = launch.build_plan(stack, launch.ServeOptions(
        mode="baseline", model=harness.make_model(tmp_path), host="127.0.0.1", port=harness.free_port(),
        cache_dir=str(tmp_path / "cache")), "python")
    old = smi({"--query-gpu=driver": (0, "575.57.08\n" * 8), "--query-gpu": (0, gpu_lines(8)),
               "--query-compute-apps": (0, "")})
    report = preflight.run_preflight(plan, {}, stack["driver"], old)
    assert report.problems == (
        "NVIDIA driver 575.57.08 is older than 580.82.07, the minimum for CUDA 13.0.1 (NVIDIA CUDA Toolkit "
        "release notes: CUDA 13.0 Update 1 needs >=580.82.07); upgrade the host's driver",)
    silent = smi({"--query-gpu=driver": (0, "[N/A]\n"), "--query-gpu": (0, gpu_lines(8)),
                  "--query-compute-apps": (0, "")})
    report = preflight.run_preflight(plan, {}, stack["driver"], silent, proc_version=str(tmp_path / "absent"))
    assert report.problems == ()
    assert "the NVIDIA driver's version is unknown; not checked against 580.82.07" in report.warnings[0]


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_serve_and_bench_exit_3_on_an_old_driver_and_start_nothing(tmp_path, command):
    env = harness.standin_env(driver_version="575.57.08")
    result = harness.run_entrypoint([command, *harness.launch_args(tmp_path, harness.free_port())], env)
    assert result.returncode == 3
    assert ("entrypoint: error: NVIDIA driver 575.57.08 is older than 580.82.07, the minimum for CUDA 13.0.1"
            in result.stderr)
    assert "starting:" not in result.stderr


def test_gpu_smoke_exits_3_on_an_old_driver(tmp_path):
    env = harness.standin_env(driver_version="575.57.08")
    result = subprocess.run([sys.executable, "-m", "builder.runtime.smoke", "--only", "gpu",
                             "--stack", str(harness.FIXTURE), "--json"],
                            capture_output=True, text=True, env=env, check=False, timeout=120)
    assert result.returncode == 3, result.stderr
    rows = {row["check"]: row for row in json.loads(result.stdout)["results"]}
    assert rows["gpu.driver"]["status"] == "fail"
    assert rows["gpu.driver"]["detail"].startswith("NVIDIA driver 575.57.08 is older than 580.82.07")
    assert {row["status"] for name, row in rows.items() if name != "gpu.driver"} == {"skip"}
