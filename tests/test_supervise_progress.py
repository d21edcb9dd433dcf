"""Reading the server's log: shard progress, stalls, readiness, tracebacks, decode figures."""

from __future__ import annotations

import io
import os
import queue

from builder.runtime.serve import progress as log_progress
from builder.runtime.serve.supervise import LogPump, describe_exit, health_url

SHARD = "Loading safetensors checkpoint shards:  75% Completed | 48/64 [00:22<00:07,  2.14it/s]"
ACCESS = '[2026-01-02 03:04:05] INFO:     127.0.0.1:5678 - "GET /health HTTP/1.1" 503'


def test_shard_line_is_parsed():
    position = log_progress.parse_shards(SHARD)
    assert position == log_progress.ShardPosition("Loading safetensors checkpoint shards", 48, 64, 75)
    assert position.describe() == "checkpoint shards 48/64 (75%)"
    assert log_progress.parse_shards("[2026-01-02 03:04:05 TP0] Load weight begin.") is None


def test_gen_throughput_is_read_from_decode_lines():
    line = (
        "[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.00, "
        "cuda graph: True, gen throughput (token/s): 89.50, #queue-req: 0, "
    )
    assert log_progress.parse_gen_throughput(line) == 89.5
    assert log_progress.parse_gen_throughput(SHARD) is None


def test_stuck_bar_is_a_stall_naming_the_shard_count():
    progress = log_progress.StartupProgress(started_at=0.0)
    progress.feed("[2026-01-02 03:04:05 TP0] Load weight begin.", 1.0)
    progress.feed(SHARD, 22.0)
    progress.feed(SHARD.replace("00:22", "00:52"), 52.0)  # a repaint at the same count
    assert progress.idle_for(322.0) == 300.0
    assert progress.stall_message(322.0) == "stalled at checkpoint shards 48/64 (75%) for 300 s"


def test_a_moving_bar_and_other_lines_are_progress_but_our_health_probes_are_not():
    progress = log_progress.StartupProgress(started_at=0.0)
    progress.feed(SHARD, 10.0)
    progress.feed(SHARD.replace("48/64", "49/64").replace("75%", "77%"), 20.0)
    assert progress.last_progress_at == 20.0
    progress.feed("[2026-01-02 03:04:05] INFO:     Uvicorn running on http://0.0.0.0:30000", 30.0)
    progress.feed(ACCESS, 90.0)
    progress.feed(ACCESS.replace("/health", "/health_generate"), 95.0)
    assert progress.last_progress_at == 30.0
    assert progress.stall_message(330.0) == (
        "stalled after log line '[2026-01-02 03:04:05] INFO:     Uvicorn running on http://0.0.0.0:30000' "
        "for 300 s"
    )


def test_ready_and_traceback_lines_are_recognised_mid_line():
    progress = log_progress.StartupProgress(started_at=0.0)
    progress.feed("[2026-01-02 03:04:05 TP3] Scheduler hit an exception: Traceback (most recent call last):", 1)
    assert progress.traceback_seen and not progress.ready
    progress.feed("[2026-01-02 03:04:05] The server is fired up and ready to roll!", 2)
    assert progress.ready


def test_where_before_any_output_and_long_lines_are_shortened():
    progress = log_progress.StartupProgress(started_at=0.0)
    assert progress.where() == "before any output"
    progress.feed("x" * 500, 1.0)
    assert progress.where() == f"after log line {'x' * 157 + '...'!r}"
    assert progress.status(31.0) == f"still starting after 31 s, {progress.where()}; last progress 30 s ago"


def test_log_pump_splits_carriage_returns_echoes_and_keeps_the_log(tmp_path):
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"first\r\n\rbar 1/2\rbar 2/2\nhalf")
    os.write(write_fd, b" line\n\xff tail")
    os.close(write_fd)
    echo, log, lines = io.StringIO(), io.StringIO(), queue.Queue()
    pump = LogPump(read_fd, log, echo, lines)
    pump.run()
    os.close(read_fd)
    expected = ["first", "bar 1/2", "bar 2/2", "half line", "\ufffd tail"]
    assert echo.getvalue() == log.getvalue() == "".join(line + "\n" for line in expected)
    received = [lines.get_nowait() for _ in range(len(expected) + 1)]
    assert received[:-1] == expected  # then the end-of-output marker


def test_health_url_reaches_wildcard_listeners_over_loopback():
    assert health_url("0.0.0.0", 30000) == "http://127.0.0.1:30000/health"
    assert health_url("::", 30000) == "http://[::1]:30000/health"
    assert health_url("10.1.2.3", 8000) == "http://10.1.2.3:8000/health"


def test_exit_descriptions():
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-9) == "was killed by SIGKILL"
