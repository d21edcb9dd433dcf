"""`entrypoint health`, the compose files' health check, against a tiny real HTTP server on loopback:
exit 0 on 200, exit 1 with one line on anything else, as the image runs it (`python -m ...`)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest

from standin_sglang import harness
from registries import free_port


class Server:
    """GET /health answers `status` (after `delay` seconds); the paths asked are recorded."""

    def __init__(self, status: int = 200, delay: float = 0.0):
        self.status, self.delay, self.paths = status, delay, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.paths.append(self.path)
                time.sleep(server.delay)
                self.send_response(server.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server():
    started = Server()
    yield started
    started.stop()


def health(*args: str, **env: str):
    return harness.run_entrypoint(["health", *args], {**harness.standin_env(), **env}, timeout=30)


def test_200_is_healthy(server):
    result = health("--port", str(server.port))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"healthy: GET http://127.0.0.1:{server.port}/health answered 200\n"
    assert result.stderr == ""
    assert server.paths == ["/health"]


def test_a_proxy_in_the_environment_is_not_used(server):
    """The server is in the same container: http_proxy pointing at nothing must not matter."""
    dead = free_port()
    result = health("--port", str(server.port), http_proxy=f"http://127.0.0.1:{dead}",
                    HTTP_PROXY=f"http://127.0.0.1:{dead}")
    assert result.returncode == 0, result.stderr


def test_the_supervisors_readiness_probe_does_not_use_a_proxy_either(server):
    """While the server starts, the supervisor asks /health too: a dead http_proxy must not make it
    look unready (its own process, as in the container: urllib reads the proxy variables once)."""
    dead = free_port()
    probe = ("import sys; from builder.runtime.serve.supervise import probe_health; "
             f"sys.exit(0 if probe_health('http://127.0.0.1:{server.port}/health', 5) else 1)")
    env = {**harness.standin_env(), "http_proxy": f"http://127.0.0.1:{dead}", "HTTP_PROXY": f"http://127.0.0.1:{dead}"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert server.paths == ["/health"]


@pytest.mark.parametrize("status", [503, 500, 204])
def test_anything_but_200_is_unhealthy_in_one_line(server, status):
    """503 is what SGLang answers while it loads and warms up."""
    server.status = status
    result = health("--port", str(server.port))
    assert result.returncode == 1
    assert result.stderr == f"entrypoint: error: GET http://127.0.0.1:{server.port}/health answered HTTP {status}\n"


def test_nothing_listening_is_unhealthy():
    port = free_port()
    result = health("--port", str(port))
    assert result.returncode == 1
    assert result.stderr == (f"entrypoint: error: GET http://127.0.0.1:{port}/health failed: "
                             "[Errno 111] Connection refused\n")


def test_a_slow_answer_times_out(server):
    server.delay = 3
    started = time.monotonic()
    result = health("--port", str(server.port), "--timeout", "0.5")
    assert time.monotonic() - started < 2.5
    assert result.returncode == 1
    assert result.stderr == f"entrypoint: error: GET http://127.0.0.1:{server.port}/health: no answer within 0.5 s\n"


def test_a_listener_that_never_answers_times_out():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        result = health("--port", str(port), "--timeout", "0.3")
    assert result.returncode == 1
    assert result.stderr.endswith("/health: no answer within 0.3 s\n")


@pytest.mark.parametrize("args, message", [
    (["--port", "0"], "argument --port: 0 is not a TCP port"),
    (["--timeout", "-1"], "argument --timeout: -1 is not a positive number of seconds"),
    (["--", "x"], "health takes no arguments after --"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, message):
    result = health(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"entrypoint: error: {message}")
    assert len(result.stderr.splitlines()) == 1
