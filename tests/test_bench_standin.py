"""`entrypoint bench` against the stand-in: launch or attach, measure, compare, report.

The stand-in decodes at STANDIN_TOK_S on an absolute schedule, so what the
client measures is the rate it was told; the pinned references come from the
fixture stack (89.5 baseline, 96.1 eagle3).
"""

from __future__ import annotations

import json
import signal

from standin_sglang import harness

WORKLOAD = ["--output-len", "128", "--input-len", "64", "--warmup", "1", "--repetitions", "3"]


def bench_args(tmp_path, port, mode="baseline", **limits):
    return ["bench", *harness.launch_args(tmp_path, port, mode=mode, **limits), *WORKLOAD,
            "--output", str(tmp_path / "bench.json")]  # fmt: skip


def load_report(tmp_path) -> dict:
    text = (tmp_path / "bench.json").read_text()
    report = json.loads(text)
    assert text == json.dumps(report, indent=2, sort_keys=True) + "\n"  # stable, sorted
    return report


def test_triton_speed_against_the_flashinfer_pin_is_a_regression(tmp_path):
    env = harness.standin_env(record=tmp_path / "standin.json", tok_s=83.9, decode_log_interval=16)
    result = harness.run_entrypoint(bench_args(tmp_path, harness.free_port()), env, timeout=120)
    assert result.returncode == 1, result.stderr
    report = load_report(tmp_path)
    assert report["verdict"] == "regression"
    assert report["reference_tok_s"] == 89.5
    assert report["ratio"] < 0.97
    assert "reference 89.50" in result.stderr and "REGRESSION" in result.stderr
    assert report["workload"] == {
        "concurrency": 1, "input_len": 64, "output_len": 128, "repetitions": 3, "seed": 0, "warmup": 1,
    }  # fmt: skip
    assert report["metrics"]["output_tok_s"]["n"] == 3
    assert report["server_log_gen_tok_s"]["n"] >= 3  # the server's own decode lines were read
    assert report["gpus"] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8
    assert report["model"].endswith("/model")
    pgid = harness.read_record(tmp_path / "standin.json")["pgid"]
    assert not harness.group_alive(pgid)  # the launched server was stopped afterwards


def test_the_pinned_speed_passes(tmp_path):
    env = harness.standin_env(tok_s=89.5)
    result = harness.run_entrypoint(bench_args(tmp_path, harness.free_port()), env, timeout=120)
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path)
    assert report["verdict"] == "pass"
    assert report["stack"] == "sglang-0.5.9-cu130" and report["mode"] == "baseline"
    for key in ("tok_s", "ttft_ms", "ratio"):
        assert report[key] > 0
    assert report["metrics"]["accept_length"] is None


def test_eagle3_reports_accept_length_against_its_own_pin(tmp_path):
    env = harness.standin_env(tok_s=96.1, accept_length=3.0)
    args = bench_args(tmp_path, harness.free_port(), mode="eagle3")
    result = harness.run_entrypoint(args, env, timeout=120)
    assert result.returncode == 0, result.stderr
    report = load_report(tmp_path)
    assert report["mode"] == "eagle3" and report["reference_tok_s"] == 96.1
    assert report["metrics"]["accept_length"]["median"] > 2.5
    assert report["verdict"] == "pass"


def test_attach_to_a_running_server_with_its_api_key(tmp_path):
    port = harness.free_port()
    env = harness.standin_env(tok_s=95.0)
    record = tmp_path / "record.json"
    key_file = tmp_path / "api-key"
    key_file.write_text("s3cret\n")
    serving = harness.Running(["serve", *harness.launch_args(tmp_path, port), "--api-key-file", str(key_file)],
                              {**env, "STANDIN_RECORD": str(record)})
    try:
        serving.wait_for(r"server ready after")
        url = f"http://127.0.0.1:{port}"
        common = ["bench", "--mode", "baseline", "--url", url, *WORKLOAD, "--output", str(tmp_path / "bench.json")]
        refused = harness.run_entrypoint(common, env)
        assert refused.returncode == 7
        assert (f"entrypoint: error: POST {url}/generate answered HTTP 401 (set SERVE_API_KEY or pass "
                "--api-key-file)") in refused.stderr
        on_argv = harness.run_entrypoint([*common, "--api-key", "s3cret"], env)
        assert on_argv.returncode == 2 and "--api-key is not taken" in on_argv.stderr
        assert "s3cret" not in on_argv.stderr

        result = harness.run_entrypoint([*common, "--reference", "80"], {**env, "SERVE_API_KEY": "s3cret"}, timeout=120)
        assert result.returncode == 0, result.stderr
        report = load_report(tmp_path)
        assert report["reference_tok_s"] == 80.0 and report["verdict"] == "faster"
        assert report["url"] == url and report["gpus"] == []
        # The server got the key, on no process's command line, and its ServerArgs log line hides it.
        server = harness.read_record(record)
        assert server["api_key"] == "s3cret" and "s3cret" not in " ".join(server["cmdline"])
        assert not {"SERVE_API_KEY", "SERVE_API_KEY_FILE"} & set(server["env"])
        printed = serving.text() + serving.output()
        assert "api_key='***'" in printed and "s3cret" not in printed
        log = (tmp_path / "cache" / "logs" / f"sglang-port{port}-node0.log").read_text()
        assert "api_key='***'" in log and "s3cret" not in log
    finally:
        serving.proc.send_signal(signal.SIGTERM)
        assert serving.finish() == 128 + signal.SIGTERM


def test_attach_to_nothing_fails_with_exit_7(tmp_path):
    port = harness.free_port()
    result = harness.run_entrypoint(
        ["bench", "--mode", "baseline", "--url", f"http://127.0.0.1:{port}", "--output", str(tmp_path / "b.json")],
        harness.standin_env(),
    )  # fmt: skip
    assert result.returncode == 7
    assert f"entrypoint: error: POST http://127.0.0.1:{port}/generate failed: [Errno 111] Connection refused" in (
        result.stderr
    )
    assert not (tmp_path / "b.json").exists()


def test_bench_launch_failures_keep_the_serve_exit_codes(tmp_path):
    env = harness.standin_env(crash_at=1)
    result = harness.run_entrypoint(bench_args(tmp_path, harness.free_port()), env)
    assert result.returncode == 4
    assert "server raised an exception while starting" in result.stderr
    assert not (tmp_path / "bench.json").exists()


def test_default_report_path_is_under_the_cache(tmp_path):
    env = harness.standin_env(tok_s=89.5)
    args = ["bench", *harness.launch_args(tmp_path, harness.free_port()), "--output-len", "32",
            "--warmup", "0", "--repetitions", "1", "--reference", "1"]  # fmt: skip
    result = harness.run_entrypoint(args, env, timeout=120)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "cache" / "bench" / "sglang-0.5.9-cu130-baseline.json"
    assert json.loads(path.read_text())["workload"]["input_len"] == 128  # the stack's bench setting
    assert f"report: {path}" in result.stderr
