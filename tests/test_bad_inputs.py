"""Every malformed input a new user tried (issue 15's table): one line, exit 2, `file:line` where the
matrix has one, and nothing started. Through the real command lines."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import docker
import pytest

from checkouts import link_project_files
from builder.cli.main import main
from builder.engine.protocol import BuildRequest
from builder.engine.docker import DockerEngine
from builder.errors import UserError
from standin_sglang import harness

REPO = Path(__file__).resolve().parent.parent
MATRIX_TEXT = (REPO / "matrix.toml").read_text()


def edited(old: str, new: str) -> str:
    assert MATRIX_TEXT.count(old) == 1, f"fixture text not found once: {old!r}"
    return MATRIX_TEXT.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def refused(capsys, argv: list[str]) -> str:
    """Run `builder ARGV`: exit 2 and exactly one line on stderr, returned."""
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("builder: error: "), err
    return err.strip().removeprefix("builder: error: ")


def matrix_file(tmp_path: Path, content: str | bytes) -> Path:
    link_project_files(tmp_path)
    path = tmp_path / "matrix.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# ---- the matrix -----------------------------------------------------------------------------


def test_a_byte_that_is_not_utf8(tmp_path, capsys):
    data = MATRIX_TEXT.encode().replace(b'name = "sglang-0.5.9"', b'name = "sglang-0.5.9\xff"')
    path = matrix_file(tmp_path, data)
    line = line_of(MATRIX_TEXT, 'name = "sglang-0.5.9"')
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line}:21: not UTF-8 text (byte 0xff); TOML files are UTF-8")


def test_a_binary_file(tmp_path, capsys):
    path = matrix_file(tmp_path, bytes(range(256)) * 4)  # byte 10 ends line 1; 0x80 is the first non-ASCII
    assert refused(capsys, ["render", "--check", "--matrix", str(path)]) == (
        f"{path}:2:118: not UTF-8 text (byte 0x80); TOML files are UTF-8")


def test_cuda_that_is_not_a_version(tmp_path, capsys):
    text = edited('replaces = "sglang-0.5.9-cu128"\ncuda = "13.0.1"', 'replaces = "sglang-0.5.9-cu128"\ncuda = "thirteen"')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'thirteen')}: sglang-0.5.9-cu130: cuda 'thirteen' must look like '13.0.1'")


def test_a_serve_mode_that_cannot_name_a_compose_service(tmp_path, capsys):
    text = edited("No figure is recorded with them.\n[stack.serve.modes.baseline-fusion]",
                  'No figure is recorded with them.\n[stack.serve.modes."baseline fusion"]')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["render", "--check", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'baseline fusion')}: sglang-0.5.9: serve mode 'baseline fusion' is not usable as a "
        "compose service name (a letter or digit, then letters, digits, '.', '_', '-')")


def test_a_base_cuda_that_is_not_a_version(tmp_path, capsys):
    text = edited('cuda = "12.8.1"\npython', 'cuda = "twelve"\npython')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'twelve')}: base cuda-12.8.1: cuda 'twelve' must look like '13.0.1'")


def test_a_url_that_is_not_a_wheel(tmp_path, capsys):
    text = edited("/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl", "/sgl-kernel-0.3.21.tar.gz")
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'packages.sgl-kernel')}: sglang-0.5.9-cu130: sgl-kernel: url must end in a wheel "
        "file name (NAME-VERSION-PYTHON-ABI-PLATFORM.whl), not 'sgl-kernel-0.3.21.tar.gz'")


def test_a_url_naming_another_wheel(tmp_path, capsys):
    text = edited("/sgl_kernel-0.3.21+cu130-cp310", "/sgl_kernel-0.3.20+cu130-cp310")
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]).endswith(
        "sglang-0.5.9-cu130: sgl-kernel 0.3.21+cu130: its url is the wheel of sgl-kernel 0.3.20+cu130")


@pytest.mark.parametrize("epoch", ["99999999999999999", "-1", "253402300800"])
@pytest.mark.parametrize("command", [["matrix"], ["render", "--check"]])
def test_source_date_epoch_out_of_range(tmp_path, capsys, epoch, command):
    text = edited("source_date_epoch = 1767225600", f"source_date_epoch = {epoch}")
    path = matrix_file(tmp_path, text)
    assert refused(capsys, [*command, "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'source_date_epoch =')}: source_date_epoch {epoch} is not a time from 1970 to 9999 "
        "(0 to 253402300799 seconds)")


def test_one_distribution_under_two_spellings(tmp_path, capsys):
    text = edited('flashinfer-cubin = { version = "0.6.4" }',
                  'flashinfer-cubin = { version = "0.6.4" }\nflashinfer_python = { version = "0.6.4" }')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'flashinfer_python')}: sglang-0.5.9: flashinfer-python and flashinfer_python "
        "name the same distribution (flashinfer-python); pin it once")


def test_the_second_spelling_in_an_axis_points_at_the_axis(tmp_path, capsys):
    text = edited('packages.torch = { version = "2.9.1" }',
                  'packages.torch = { version = "2.9.1" }\npackages.Flashinfer_Python = { version = "0.6.4" }')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'Flashinfer_Python')}: sglang-0.5.9-cu128: flashinfer-python and Flashinfer_Python "
        "name the same distribution (flashinfer-python); pin it once")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "matrix.toml"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "builder.cli", "matrix", "--matrix", str(fifo)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"builder: error: {fifo}: cannot read the matrix: not a regular file\n"


def test_a_problem_every_row_shares_is_one_line_at_its_own_line(tmp_path, capsys):
    text = edited('(SM120) PCIe"\ntarget_arch = ["12.0"]', '(SM120) PCIe"\ntarget_arch = ["12"]')
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'target_arch')}: sglang-0.5.9: target_arch '12' must look like '12.0'")


def test_an_axis_value_problem_points_at_its_axis_table(tmp_path, capsys):
    text = edited("[stack.axes.cuda.cu128]", "[stack.axes.cuda.CU128]")
    path = matrix_file(tmp_path, text)
    assert refused(capsys, ["matrix", "--matrix", str(path)]) == (
        f"{path}:{line_of(text, 'CU128')}: stack name 'sglang-0.5.9-CU128' is not usable as a tag "
        "(at most 100 of: lowercase letters, digits, '.', '_', '-')")


# ---- the image's entrypoint ---------------------------------------------------------------------


def entrypoint_refuses(args: list[str], tmp_path: Path) -> str:
    """Exit 2, one line, and no server started (the stand-in records every start)."""
    record = tmp_path / "started.json"
    result = harness.run_entrypoint(args, harness.standin_env(record=record))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("entrypoint: error: "), result.stderr
    assert not record.exists()
    return result.stderr.strip().removeprefix("entrypoint: error: ")


@pytest.mark.parametrize("url, message", [
    ("notaurl", "argument --url: 'notaurl' is not a server URL; give http://HOST:PORT"),
    ("http://[::1", "argument --url: 'http://[::1' is not a URL: Invalid IPv6 URL"),
    ("http://host:99999", "argument --url: 'http://host:99999' is not a URL: Port out of range 0-65535"),
    ("ftp://host:1", "argument --url: 'ftp://host:1' is not a server URL; give http://HOST:PORT"),
])
def test_bench_url_that_is_not_a_server_url(tmp_path, url, message):
    assert entrypoint_refuses(["bench", "--mode", "baseline", "--url", url], tmp_path) == (
        f"{message} (see `entrypoint bench --help`)")


def test_model_naming_a_regular_file(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 64)
    args = harness.launch_args(tmp_path, harness.free_port(), model=str(weights))
    assert entrypoint_refuses(["serve", *args], tmp_path) == (
        f"--model {weights} is a file; give the checkpoint directory (config.json and the weights)")


def test_a_gguf_file_is_a_model(tmp_path):
    """SGLang loads a single GGUF file (its check_gguf_file): the one file --model may name."""
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"GGUF" + b"\0" * 60)
    result = harness.run_entrypoint(["serve", "--mode", "baseline", "--model", str(weights), "--dry-run"],
                                    harness.standin_env())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("multi_node, message", [
    (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:5000"],
     "--node-rank 2 must be below --nnodes 2 (ranks count from 0)"),
    (["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1"],
     "--dist-init-addr '127.0.0.1' must be HOST:PORT (node 0's address and a free port)"),
    (["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "[::1]:"],
     "--dist-init-addr '[::1]:' must be HOST:PORT (node 0's address and a free port)"),
])
def test_multi_node_arguments_that_contradict(tmp_path, multi_node, message):
    args = harness.launch_args(tmp_path, harness.free_port())
    assert entrypoint_refuses(["serve", *args, *multi_node], tmp_path) == message


class AnswersJson:
    """A server whose /generate answers one plain JSON document, not an event stream."""

    BODY = b'{"text": "hello", "meta_info": {"completion_tokens": 8}}'

    def __init__(self):
        body = self.BODY

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_bench_against_a_server_that_does_not_stream_says_what_came_back(tmp_path):
    server = AnswersJson()
    try:
        result = harness.run_entrypoint(["bench", "--mode", "baseline", "--url", server.url, "--warmup", "0",
                                         "--repetitions", "1", "--output", str(tmp_path / "b.json")],
                                        harness.standin_env())
    finally:
        server.stop()
    assert result.returncode == 7, result.stderr  # BenchFailed: the server, not the arguments
    assert result.stderr.splitlines()[-1] == (
        f"entrypoint: error: server streamed no tokens for /generate; it answered "
        f"{AnswersJson.BODY.decode()!r} instead of an event stream")


# ---- images and engines ---------------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.parametrize("image, message", [
    ("", "no image given: name one as REPOSITORY[:TAG][@DIGEST] or an image id"),
    ("  ", "no image given: name one as REPOSITORY[:TAG][@DIGEST] or an image id"),
    ("Sglang:0.5.9", "'Sglang:0.5.9' is not an image reference: expected [HOST[:PORT]/]NAME[:TAG][@sha256:DIGEST] "
                     "with a lowercase NAME, or an image id"),
])
def test_smoke_of_no_image_starts_no_container(capsys, image, message):
    client = docker.from_env()
    before = {c.id for c in client.containers.list(all=True)}
    assert refused(capsys, ["smoke", image]) == message
    assert {c.id for c in client.containers.list(all=True)} == before


@pytest.mark.engine
def test_docker_engine_names_the_fix_for_a_base_only_buildah_has(tmp_path):
    """`builder base` loads the local base into buildah; BuildKit would look for it on localhost:80."""
    base = f"localhost/builder-base-absent-{uuid.uuid4().hex[:8]}:bookworm"
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN true\n")
    request = BuildRequest(context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile", tags=("localhost/never:1",),
                           source_date_epoch=0)
    engine = DockerEngine()
    with pytest.raises(UserError) as refusal:
        engine.build(request)
    assert str(refusal.value) == (f"base image {base} is not in the Docker daemon: run `builder base --engine docker`, "
                                  f"or copy it from buildah with `buildah push {base} docker-daemon:{base}`")
    assert not engine.exists("localhost/never:1")
