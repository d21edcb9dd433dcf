"""`entrypoint serve` supervising the stand-in server through every path of a start.

Timeouts are seconds here instead of minutes; the stand-in's load speed, stall
point, crash and exit are set through its STANDIN_* variables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from standin_sglang import harness


def get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


def record_path(tmp_path):
    return tmp_path / "standin.json"


def assert_group_gone(tmp_path):
    """Every process of the server's group (workers included) has ended."""
    pgid = harness.read_record(record_path(tmp_path))["pgid"]
    deadline = time.monotonic() + 5
    while harness.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not harness.group_alive(pgid), f"process group {pgid} still has members"


def test_fast_ready_serves_then_sigterm_stops_the_group(tmp_path):
    port = harness.free_port()
    env = harness.standin_env(record=record_path(tmp_path), workers=2)
    model = harness.make_model(tmp_path)
    running = harness.Running(["serve", *harness.launch_args(tmp_path, port, model=model)], env)
    running.wait_for(r"server ready after \d+ s \(ready log line\); log: ")

    assert get(f"http://127.0.0.1:{port}/health")[0] == 200
    models = json.loads(get(f"http://127.0.0.1:{port}/v1/models")[1])
    assert models["data"][0]["id"] == model
    record = harness.read_record(record_path(tmp_path))
    assert record["argv"] == [
        "--model-path", model, "--tp-size", "8", "--attention-backend", "flashinfer",
        "--disable-custom-all-reduce", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    cache = tmp_path / "cache"
    assert record["env"]["SGLANG_DISABLE_CUDNN_CHECK"] == "1"
    assert record["env"]["NCCL_P2P_DISABLE"] == "1"
    assert record["env"]["FLASHINFER_WORKSPACE_BASE"] == f"{cache}/flashinfer"
    assert record["env"]["TVM_FFI_CACHE_DIR"] == f"{cache}/tvm-ffi"
    assert record["env"]["TRITON_CACHE_DIR"] == f"{cache}/triton"
    assert record["pgid"] == record["pid"]  # the server leads its own group

    running.proc.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM
    assert "received SIGTERM: stopping the server's process group" in running.text()
    assert_group_gone(tmp_path)
    log = (cache / "logs" / f"sglang-port{port}-node0.log").read_text()
    assert log.startswith("# entrypoint: ")
    assert "Loading safetensors checkpoint shards: 100% Completed | 4/4" in log
    assert "The server is fired up and ready to roll!" in log
    assert "Loading safetensors checkpoint shards: 100% Completed | 4/4" in running.output()  # echoed


def test_slow_load_that_keeps_progressing_is_not_killed(tmp_path):
    port = harness.free_port()
    env = harness.standin_env(shards=12, shard_s=0.5)  # 6 s of loading, 3x the stall timeout
    running = harness.Running(["serve", *harness.launch_args(tmp_path, port, stall=2)], env)
    running.wait_for(r"server ready after \d+ s", timeout=60)
    assert "stalled" not in running.text()
    running.proc.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM


@pytest.mark.parametrize("repaint", [0, 0.3], ids=["silent", "bar-repainted"])
def test_stall_at_75_percent_is_killed_naming_where(tmp_path, repaint):
    env = harness.standin_env(record=record_path(tmp_path), shards=8, stall_at=6, repaint_s=repaint, workers=1)
    args = harness.launch_args(tmp_path, harness.free_port(), stall=1.5)
    result = harness.run_entrypoint(["serve", *args], env)
    assert result.returncode == 5, result.stderr
    assert re.search(r"entrypoint: error: stalled at checkpoint shards 6/8 \(75%\) for \d+ s\n", result.stderr)
    assert "---- last " in result.stderr
    assert "Loading safetensors checkpoint shards:  75% Completed | 6/8" in result.stderr  # the tail
    assert_group_gone(tmp_path)


def test_warm_up_that_never_ends_stalls_despite_our_health_probes(tmp_path):
    env = harness.standin_env(warmup_hang=1)
    port = harness.free_port()
    result = harness.run_entrypoint(["serve", *harness.launch_args(tmp_path, port, stall=2.5)], env)
    assert result.returncode == 5, result.stderr
    assert "GET /health HTTP/1.1\" 503" in result.stdout  # probes answered, and logged ...
    assert (  # ... but not mistaken for progress
        "entrypoint: error: stalled after log line '[" in result.stderr
        and f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)' for " in result.stderr
    )


def test_total_cap_stops_a_load_that_progresses_too_long(tmp_path):
    env = harness.standin_env(shards=200, shard_s=0.05)
    args = harness.launch_args(tmp_path, harness.free_port(), stall=5, start=2)
    result = harness.run_entrypoint(["serve", *args], env)
    assert result.returncode == 5, result.stderr
    assert re.search(
        r"entrypoint: error: not ready after 2 s \(the total cap\), at checkpoint shards \d+/200", result.stderr
    )


def test_traceback_fails_at_once_even_while_the_server_hangs_on(tmp_path):
    env = harness.standin_env(record=record_path(tmp_path), crash_at=2, workers=1)
    args = harness.launch_args(tmp_path, harness.free_port(), stall=120, start=300)
    result = harness.run_entrypoint(["serve", *args], env, timeout=30)  # far below the stall timeout
    assert result.returncode == 4, result.stderr
    assert (
        "entrypoint: error: server raised an exception while starting: "
        "'torch.OutOfMemoryError: CUDA out of memory."
    ) in result.stderr
    tail = result.stderr.split("---- last ", 1)[1]
    assert "Scheduler hit an exception: Traceback (most recent call last):" in tail
    assert_group_gone(tmp_path)


def test_early_exit_fails_at_once_with_the_last_lines(tmp_path):
    env = harness.standin_env(exit_at="2:3")
    args = harness.launch_args(tmp_path, harness.free_port(), stall=120, start=300)
    result = harness.run_entrypoint(["serve", *args], env, timeout=30)
    assert result.returncode == 4, result.stderr
    assert "entrypoint: error: server exited with status 3 before it was ready" in result.stderr
    assert "Received sigquit from a child process" in result.stderr.split("---- last ", 1)[1]


def test_bad_server_arguments_surface_as_an_early_exit(tmp_path):
    env = harness.standin_env()
    args = harness.launch_args(tmp_path, harness.free_port())
    result = harness.run_entrypoint(["serve", *args, "--", "--attention-backend", "fa9"], env)
    assert result.returncode == 4
    assert "argument --attention-backend: invalid choice: 'fa9'" in result.stderr
    assert "server exited with status 2 before it was ready" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_stop_signal_during_load_is_forwarded_and_the_group_cleaned(tmp_path, signum):
    env = harness.standin_env(record=record_path(tmp_path), shards=100, shard_s=0.2, workers=3)
    running = harness.Running(["serve", *harness.launch_args(tmp_path, harness.free_port())], env)
    running.wait_for(r"checkpoint shards: .* 2/100", stream="stdout")
    running.proc.send_signal(signum)
    assert running.finish() == 128 + signum
    assert f"received {signal.Signals(signum).name}: stopping the server's process group" in running.text()
    assert "SIGKILL" not in running.text()  # the stand-in obeyed the forwarded signal
    assert_group_gone(tmp_path)


def test_workers_ignoring_sigterm_are_killed_after_the_stop_timeout(tmp_path):
    env = harness.standin_env(record=record_path(tmp_path), shards=100, shard_s=0.2, workers=2, ignore_term=1)
    args = harness.launch_args(tmp_path, harness.free_port(), stop=1)
    running = harness.Running(["serve", *args], env)
    running.wait_for(r"checkpoint shards: .* 2/100", stream="stdout")
    running.proc.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM
    assert "process group still running: sending SIGKILL" in running.text()
    assert_group_gone(tmp_path)


def test_ready_through_health_when_no_ready_line_comes(tmp_path):
    env = harness.standin_env(ready_line=0)
    running = harness.Running(["serve", *harness.launch_args(tmp_path, harness.free_port())], env)
    running.wait_for(r"server ready after \d+ s \(/health answered 200\)")
    running.proc.send_signal(signal.SIGTERM)
    assert running.finish() == 128 + signal.SIGTERM


def test_server_dying_after_ready_exits_6(tmp_path):
    env = harness.standin_env(die_after_ready="0.5:7")
    result = harness.run_entrypoint(["serve", *harness.launch_args(tmp_path, harness.free_port())], env)
    assert result.returncode == 6, result.stderr
    assert "entrypoint: error: server exited with status 7 after it was ready" in result.stderr
    assert "terminated with -9" in result.stderr.split("---- last ", 1)[1]


def test_previous_log_is_kept_beside_the_new_one(tmp_path):
    env = harness.standin_env(exit_at="1:3")
    port = harness.free_port()
    args = harness.launch_args(tmp_path, port)
    harness.run_entrypoint(["serve", *args], env)
    harness.run_entrypoint(["serve", *args, "--log-file", str(tmp_path / "mine.log")], env)
    harness.run_entrypoint(["serve", *args, "--log-file", str(tmp_path / "mine.log")], env)
    assert (tmp_path / "cache" / "logs" / f"sglang-port{port}-node0.log").exists()
    assert "Received sigquit" in (tmp_path / "mine.log").read_text()
    assert "Received sigquit" in (tmp_path / "mine.log.1").read_text()


# ---- as PID 1 of a container ---------------------------------------------------------------


def pid_namespaces_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


def children_of(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(child) for child in handle.read().split()]
    return found


def zombie_children(pid: int) -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            zombies.append(int(entry))
    return zombies


@pytest.mark.skipif(not pid_namespaces_available(), reason="needs unshare --pid (root)")
def test_as_pid_1_orphans_are_reaped_and_sigterm_is_handled(tmp_path):
    env = harness.standin_env(orphan=1, workers=1)
    command = [
        shutil.which("unshare"), "--pid", "--fork", "--mount-proc",
        sys.executable, "-m", "builder.runtime.serve.entrypoint",
        "serve", *harness.launch_args(tmp_path, harness.free_port()),
    ]  # fmt: skip
    running = harness.Running([], env, command=command)
    running.wait_for(r"server ready after")
    running.wait_for(r"orphan \d+ re-parented to 1$", stream="stdout")  # the entrypoint is its parent now
    (init,) = children_of(running.proc.pid)  # the entrypoint, PID 1 inside
    time.sleep(1.0)  # the orphan has exited by now; PID 1 must have reaped it
    assert zombie_children(init) == []
    os.kill(init, signal.SIGTERM)  # PID 1 ignores signals it has no handler for
    assert running.finish() == 128 + signal.SIGTERM
    assert "received SIGTERM" in running.text()
