"""The Supervisor used directly: progress reports while waiting, the job after ready, log errors."""

from __future__ import annotations

import io
import sys

import pytest

from builder.runtime.serve.errors import PreflightError
from builder.runtime.serve.supervise import Supervisor, Timeouts, health_url
from standin_sglang import harness


def standin_command(tmp_path, port):
    model = harness.make_model(tmp_path)
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port)]


def test_waiting_reports_where_the_load_is_and_the_job_runs_after_ready(tmp_path):
    port = harness.free_port()
    err = io.StringIO()
    seen_at_job = {}

    def job():
        seen_at_job["ready"] = supervisor.progress.ready
        return 0

    supervisor = Supervisor(
        command=standin_command(tmp_path, port),
        env=harness.standin_env(shards=8, shard_s=0.25),
        log_path=str(tmp_path / "logs" / "server.log"),
        health=health_url("127.0.0.1", port),
        timeouts=Timeouts(stall_s=5, start_s=60, stop_s=3, status_interval_s=0.5),
        out=io.StringIO(),
        err=err,
    )
    assert supervisor.run(job=job) == 0
    assert seen_at_job == {"ready": True}
    status = [line for line in err.getvalue().splitlines() if "still starting after" in line]
    assert status, err.getvalue()
    assert any("at checkpoint shards " in line and "/8 (" in line for line in status)
    assert "job finished: stopping the server" in err.getvalue()
    assert supervisor.returncode is not None  # stopped and reaped


def test_unwritable_log_is_a_preflight_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    supervisor = Supervisor(
        command=[sys.executable, "-c", "pass"],
        env={},
        log_path=str(blocker / "server.log"),
        health="http://127.0.0.1:1/health",
        err=io.StringIO(),
    )
    with pytest.raises(PreflightError, match=f"cannot write the server log {blocker}/server.log"):
        supervisor.run()
