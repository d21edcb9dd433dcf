"""The CUDA 13 row locked end to end with every kind of source on loopback (tests/loopback_index.py):
its `index =` sources (PyTorch's and FlashInfer's), its `url =` wheel and pip's default index served
from 127.0.0.1 with small wheels built here, and its base image (the local base `builder base` made,
pushed under the nvidia/cuda name and tag) on Debian's docker-registry. `builder lock` resolves and
hashes the closure and the base digest, `builder render` writes the hashed requirements and
`FROM image@digest`, and pip installs exactly the locked files from the loopback sources and refuses
a wheel the server swapped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.publish import base_digest
from builder.publish.registry_http import Retry
from builder.errors import UserError
from loopback_index import LoopbackServer, cu130_env, cu130_project, sha256_of
from support import REPO, Registry, free_port, run_builder

pytestmark = pytest.mark.engine  # the registry's base is pushed from buildah's storage

LOCAL_ROW = "sglang-0.5.9-cu128-local"  # its lock entry holds the digest `builder base` recorded


@pytest.fixture(scope="module")
def pushed_base(tmp_path_factory, local_base):
    """A loopback registry holding the local base under the CUDA 13 base's name and tag."""
    root = tmp_path_factory.mktemp("registry")
    server = Registry(root / "registry", free_port())
    server.root.mkdir()
    server.start()
    reference = f"{server.host}/nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    digest_file = root / "pushed.digest"
    subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", "--disable-compression",
                    "--digestfile", str(digest_file), local_base, f"docker://{reference}"], check=True)
    yield {"registry": server, "local_base": local_base, "pushed_digest": digest_file.read_text().strip()}
    server.stop()


@pytest.fixture(scope="module")
def locked(tmp_path_factory, pushed_base):
    """The project, locked and rendered through the command line."""
    server = LoopbackServer(tmp_path_factory.mktemp("sources"))
    project = cu130_project(tmp_path_factory.mktemp("project"), server, pushed_base["registry"].host)
    env = cu130_env(project)
    lock_run = run_builder("lock", "--matrix", str(project.matrix), "--stack", project.stack, env=env)
    render_run = run_builder("render", "--matrix", str(project.matrix), "--stack", project.stack, env=env)
    yield {"project": project, "server": server, "env": env, "lock": lock_run, "render": render_run,
           "entry": json.loads((project.root / "matrix.lock").read_text())["stacks"][project.stack]}
    server.stop()


def test_lock_records_the_registry_digest_of_the_base_builder_base_made(locked, pushed_base):
    assert locked["lock"].returncode == 0, locked["lock"].stderr
    registry = pushed_base["registry"]
    base = locked["entry"]["base"]
    digest = registry.manifest_digest("nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04")
    assert base == {"name": "cuda-13.0.1", "image": locked["project"].base_image, "digest": digest, "local": False}
    assert digest == pushed_base["pushed_digest"]
    # That manifest is the image `builder base` made: its config digest (the image id) is what the lock records.
    manifest = json.loads(subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.Manifest}}", pushed_base["local_base"]],
        check=True, capture_output=True, text=True).stdout)
    recorded = json.loads((REPO / "matrix.lock").read_text())["stacks"][LOCAL_ROW]["base"]["digest"]
    assert manifest["config"]["digest"] == recorded


def test_every_source_kind_is_locked_from_the_right_place(locked):
    project, entry = locked["project"], locked["entry"]
    found = entry["distributions"]
    versions = {name: item["version"] for name, item in found.items()}
    assert versions == {"filelock": "3.20.0", "flashinfer-cubin": "0.6.4", "flashinfer-jit-cache": "0.6.4+cu130",
                        "flashinfer-python": "0.6.4", "sgl-kernel": "0.3.21+cu130", "sglang": "0.5.9",
                        "torch": "2.9.1+cu130"}
    sources = {name: item["source"] for name, item in found.items()}
    assert sources == {"filelock": "default index", "flashinfer-cubin": "default index",
                       "flashinfer-jit-cache": project.flashinfer_index, "flashinfer-python": "default index",
                       "sgl-kernel": project.sgl_kernel_url, "sglang": "default index",
                       "torch": project.torch_index}
    for name, item in found.items():
        assert item["sha256"] == sha256_of(project.wheel(name, item["version"])), name
        assert item["hashes"] == [item["sha256"]]
    assert entry["indexes"] == [project.flashinfer_index, project.torch_index]
    assert entry["index_strategy"] == "unsafe-best-match"
    assert {name: item["group"] for name, item in found.items()} == {
        "torch": "torch", "filelock": "torch", "sgl-kernel": "kernels", "flashinfer-python": "kernels",
        "flashinfer-cubin": "kernels", "flashinfer-jit-cache": "kernels", "sglang": "sglang"}


def test_render_writes_hashed_requirements_and_the_pinned_base(locked):
    assert locked["render"].returncode == 0, locked["render"].stderr
    project, found = locked["project"], locked["entry"]["distributions"]
    folder = project.root / "images" / project.stack
    dockerfile = (folder / "Dockerfile").read_text()
    pinned = project.base_image.removesuffix(":13.0.1-cudnn-devel-ubuntu24.04") + "@" + locked["entry"]["base"]["digest"]
    assert (f"\n# {project.base_image}, pinned to the digest `builder lock` resolved (matrix.lock).\n"
            f"FROM {pinned}\n") in dockerfile
    torch = (folder / "requirements" / "10-torch.txt").read_text()
    assert torch.splitlines()[2:] == [
        f"--extra-index-url {project.torch_index}",
        "filelock==3.20.0 \\", f"    --hash=sha256:{found['filelock']['sha256']}",
        "torch==2.9.1+cu130 \\", f"    --hash=sha256:{found['torch']['sha256']}"]
    kernels = (folder / "requirements" / "20-kernels.txt").read_text()
    assert f"sgl-kernel @ {project.sgl_kernel_url} \\\n    --hash=sha256:{found['sgl-kernel']['sha256']}\n" in kernels
    assert f"--extra-index-url {project.flashinfer_index}\n" in kernels
    check = run_builder("render", "--check", "--matrix", str(project.matrix), "--stack", project.stack,
                        env=locked["env"])
    assert check.returncode == 0, check.stdout + check.stderr


def _pip(locked, command: str, target: Path) -> subprocess.CompletedProcess:
    """pip, hash-checking every file, from the loopback default index and the files' own index lines."""
    project = locked["project"]
    requirements = sorted((project.root / "images" / project.stack / "requirements").glob("*.txt"))
    where = ["--target", str(target)] if command == "install" else ["--dest", str(target)]
    return subprocess.run(
        [sys.executable, "-m", "pip", command, "--isolated", "--disable-pip-version-check", "--no-deps",
         "--require-hashes", "--only-binary=:all:", "--index-url", f"{project.default_index}/", *where,
         *(arg for path in requirements for arg in ("-r", str(path)))],
        capture_output=True, text=True, timeout=300)


def test_pip_installs_exactly_the_locked_files(locked, tmp_path):
    installed = _pip(locked, "install", tmp_path / "site")
    assert installed.returncode == 0, installed.stderr
    found = locked["entry"]["distributions"]
    metadata = {}
    for info in (tmp_path / "site").glob("*.dist-info"):
        fields = dict(line.split(": ", 1) for line in (info / "METADATA").read_text().splitlines() if ": " in line)
        metadata[fields["Name"]] = fields["Version"]
    assert metadata == {name: item["version"] for name, item in found.items()}
    # Each module says which server folder its wheel came from.
    origin = {name: (tmp_path / "site" / name.replace("-", "_") / "__init__.py").read_text() for name in found}
    assert origin["torch"] == "SOURCE = 'torch-cu130'\n"
    assert origin["filelock"] == "SOURCE = 'default'\n"  # not the PyTorch index's older copy
    assert origin["flashinfer-jit-cache"] == "SOURCE = 'flashinfer-cu130'\n"
    assert origin["sgl-kernel"] == "SOURCE = 'v0.3.21'\n"  # the release URL's folder


@pytest.mark.parametrize("name, version", [("torch", "2.9.1+cu130"), ("sgl-kernel", "0.3.21+cu130")])
def test_a_wheel_swapped_on_the_server_is_refused_by_hash(locked, tmp_path, name, version):
    project, server = locked["project"], locked["server"]
    wheel = project.wheel(name, version)
    original = server.tamper(wheel)
    try:
        downloaded = _pip(locked, "download", tmp_path / "wheels")
    finally:
        server.restore(wheel, original)
    assert downloaded.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in downloaded.stderr
    expected = locked["entry"]["distributions"][name]["sha256"]
    assert f"Expected sha256 {expected}" in downloaded.stderr
    assert not (tmp_path / "wheels" / wheel.name).exists()


def test_an_unreachable_base_is_one_line_and_the_lock_is_untouched(locked, tmp_path, monkeypatch, capsys):
    """The same project with its base on a port nothing listens on: the wheels resolve, the base does not."""
    project = locked["project"]
    dead = f"127.0.0.1:{free_port()}/nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    matrix = project.root / "matrix-dead-base.toml"
    matrix.write_text(project.matrix.read_text().replace(project.base_image, dead))
    lock_file = project.root / "matrix.lock"
    before = lock_file.read_bytes()
    for key, value in locked["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("BUILDER_LOCK", raising=False)
    delays: list[float] = []
    monkeypatch.setattr(base_digest, "RETRY", Retry(2, 0.01, delays.append, UserError))
    assert main(["lock", "--matrix", str(matrix), "--stack", project.stack]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"builder: error: {project.stack}: resolving base {dead} failed after 2 attempts: "
                       f"registry {dead.split('/')[0]} unreachable (connection refused); nothing was locked")
    assert delays == [0.01]
    assert lock_file.read_bytes() == before
