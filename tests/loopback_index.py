"""Wheel sources on 127.0.0.1, for resolving and installing without the network: small real wheels
built here, PEP 503 simple indexes and plain file URLs served over HTTP, and a project whose
CUDA 13 row is the real one with every source moved onto loopback.

    make_wheel(directory, name, version, requires=(), tag="py3-none-any", payload="") -> Path
    LoopbackServer(root)                 serves root; .url, .publish(path, wheels) -> index URL,
                                         .file_url(wheel), .tamper(wheel), .stop(); /broken/... answers 500
    cu130_project(directory, server, registry_host, archive) -> Cu130Project
                                         the real matrix.toml with the cu130 row's indexes, wheel URL and
                                         base image on loopback, and stand-in wheels for its whole closure;
                                         its base (the local Debian base, pushed) takes its system packages
                                         from `archive`, a Debian archive on loopback (source line, keyring)
    cu130_env(project, base_env)         the environment `builder lock` runs under for it (uv's default
                                         index on loopback, a private uv cache and Docker config)

The stand-ins mirror where the real wheels come from (STACK.md): torch 2.9.1+cu130 from the PyTorch
index and 2.9.1 (another build) on the default index; sgl-kernel 0.3.21+cu130 at its release URL and
0.3.21 on the default index; flashinfer-jit-cache 0.6.4+cu130 from FlashInfer's index; sglang 0.5.9
declaring flashinfer==0.6.3, which the matrix overrides. filelock is on both the default index (3.20.0)
and the PyTorch index (an older mirror copy, 3.19.1), as PyTorch's index mirrors common packages: the
index strategy must take the default index's. Each wheel's module says where it was published
(`SOURCE = "..."`), so an install shows which file it took.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.config.matrix import load_matrix
from checkouts import REPO, link_project_files

CU130 = "sglang-0.5.9-cu130"
WHEEL_TIME = (2026, 1, 1, 0, 0, 0)


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = (),
               tag: str = "py3-none-any", payload: str = "") -> Path:
    """A minimal valid wheel: METADATA, WHEEL, RECORD and one module holding `payload`."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": payload,
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\n"
        f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"{dist}-{version}-{tag}.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(zipfile.ZipInfo(path, WHEEL_TIME), text)
    return wheel


def _tag(filename: str) -> str:
    """'sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl' -> 'cp310-abi3-manylinux2014_x86_64'."""
    return filename.removesuffix(".whl").split("-", 2)[2]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def send_header(self, keyword: str, value: str) -> None:
        # Like the default index here: no validators, so uv reads each page again on every run.
        if keyword.lower() != "last-modified":
            super().send_header(keyword, value)

    def _broken(self) -> bool:
        if self.path.startswith("/broken/"):
            self.send_error(500, "Internal Server Error")
            return True
        return False

    def do_GET(self) -> None:
        if not self._broken():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._broken():
            super().do_HEAD()


class LoopbackServer:
    """Files under `root` over HTTP on 127.0.0.1 (a free port); every path under /broken/ answers 500."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      functools.partial(_Handler, directory=str(root)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._indexes: dict[str, list[Path]] = {}  # index path -> wheels published there

    def file_url(self, path: Path) -> str:
        return f"{self.url}/{path.relative_to(self.root).as_posix()}"

    def publish(self, index_path: str, wheels: list[Path]) -> str:
        """A PEP 503 simple index at <index_path>/<name>/ linking the wheels (files under root) with
        their sha256, as real indexes do; returns its URL."""
        index_path = index_path.strip("/")
        self._indexes.setdefault(index_path, []).extend(wheels)
        by_name: dict[str, list[Path]] = {}
        for wheel in self._indexes[index_path]:
            by_name.setdefault(canonicalize_name(parse_wheel_filename(wheel.name)[0]), []).append(wheel)
        for name, files in by_name.items():
            links = "".join(f'<a href="/{w.relative_to(self.root).as_posix()}#sha256={sha256_of(w)}">{w.name}</a>\n'
                            for w in files)
            page = self.root / index_path / name / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        return f"{self.url}/{index_path}"

    def tamper(self, wheel: Path) -> bytes:
        """Replace the wheel by another one of the same name and version (other module content), and
        republish the index pages listing it, as a compromised server would; returns the original bytes."""
        original = wheel.read_bytes()
        name, version, _, _ = parse_wheel_filename(wheel.name)
        rebuilt = make_wheel(wheel.parent / "tampered", str(name), str(version), tag=_tag(wheel.name),
                             payload="SOURCE = 'tampered'\n")
        wheel.write_bytes(rebuilt.read_bytes())
        for index_path, wheels in self._indexes.items():
            if wheel in wheels:
                self.publish(index_path, [])
        return original

    def restore(self, wheel: Path, original: bytes) -> None:
        wheel.write_bytes(original)
        for index_path, wheels in self._indexes.items():
            if wheel in wheels:
                self.publish(index_path, [])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Cu130Project:
    root: Path  # holds matrix.toml (and, once locked and rendered, matrix.lock and images/)
    matrix: Path
    stack: str  # the row: sglang-0.5.9-cu130
    default_index: str  # what stands for pip's default index (UV_DEFAULT_INDEX, pip --index-url)
    torch_index: str  # the row's `index =` sources, on loopback
    flashinfer_index: str
    sgl_kernel_url: str  # the row's `url =` source, on loopback
    base_image: str  # the row's base, on the loopback registry
    wheels: dict[str, Path]  # "<name>==<version>" -> the wheel file served for it

    def wheel(self, name: str, version: str) -> Path:
        return self.wheels[f"{name}=={version}"]


def _on_loopback(server: LoopbackServer, url: str) -> str:
    """`url` on the loopback server, its host name the first folder (two hosts may serve one path)."""
    parts = urlsplit(url)
    return f"{server.url}/{parts.hostname}{parts.path.rstrip('/')}"


# What the row's base gets from the loopback Debian archive: a package the local base lacks, with its
# dependencies (libjq1, libonig5), instead of Ubuntu's python3.12 (Ubuntu's archive is unreachable here).
ROW_SYSTEM_PACKAGES = ("jq",)


def _debian_base(text: str, base_image: str, archive: tuple[str, Path]) -> str:
    """The cu130 row's base table: the pushed local base (Debian, python3.11), its system packages from
    the loopback archive."""
    start = text.index('[bases."cuda-13.0.1"]\n')
    end = text.index("\n\n", start)
    source, keyring = archive
    table = (f'[bases."cuda-13.0.1"]\nimage = "{base_image}"\ncuda = "13.0.1"\npython = "3.11"\n'
             f'venv_python = "/usr/bin/python3.11"\nsystem_packages = {list(ROW_SYSTEM_PACKAGES)!r}\n'
             f'distribution = "debian"\nsuite = "bookworm"\nsources = ["{source}"]\nkeyring = "{keyring}"\n'
             f'snapshot = ""').replace("'", '"')
    return text[:start] + table + text[end:]


def cu130_project(directory: Path, server: LoopbackServer, registry_host: str,
                  archive: tuple[str, Path]) -> Cu130Project:
    """The real matrix.toml in `directory`, its cu130 row's sources and base moved onto loopback, and
    stand-in wheels for the row's closure published on `server`."""
    real = load_matrix(REPO / "matrix.toml").stack(CU130)
    torch_index = _on_loopback(server, real.package("torch").index)
    flashinfer_index = _on_loopback(server, real.package("flashinfer-jit-cache").index)
    sgl_kernel_url = _on_loopback(server, real.package("sgl-kernel").url)
    files = server.root / "files"
    default, torch_files, flashinfer_files = files / "default", files / "torch-cu130", files / "flashinfer-cu130"

    def wheel(folder, name, version, requires=(), tag="py3-none-any"):
        return make_wheel(folder, name, version, requires, tag, payload=f"SOURCE = {folder.name!r}\n")

    on_default = [
        wheel(default, "torch", "2.9.1", ("filelock",)),
        wheel(default, "filelock", "3.20.0"),
        wheel(default, "sgl-kernel", "0.3.21", ("torch",)),
        wheel(default, "flashinfer-python", "0.6.3", ("torch",)),
        wheel(default, "flashinfer-python", "0.6.4", ("torch", "flashinfer-cubin")),
        wheel(default, "flashinfer-cubin", "0.6.3"),
        wheel(default, "flashinfer-cubin", "0.6.4"),
        wheel(default, "sglang", "0.5.9", ("flashinfer_python==0.6.3", "flashinfer_cubin==0.6.3", "torch==2.9.1",
                                           "sgl-kernel==0.3.21", "filelock")),
    ]
    on_torch_index = [wheel(torch_files, "torch", "2.9.1+cu130", ("filelock",)),
                      wheel(torch_files, "filelock", "3.19.1")]
    on_flashinfer_index = [wheel(flashinfer_files, "flashinfer-jit-cache", "0.6.4+cu130")]
    url_path = server.root / urlsplit(sgl_kernel_url).path.lstrip("/")
    sgl_kernel = wheel(url_path.parent, "sgl-kernel", "0.3.21+cu130", ("torch",), tag=_tag(url_path.name))
    assert sgl_kernel == url_path, (sgl_kernel, url_path)
    default_index = server.publish("default/simple", on_default)
    server.publish(urlsplit(torch_index).path, on_torch_index)
    server.publish(urlsplit(flashinfer_index).path, on_flashinfer_index)

    real_base = real.base.image
    base_image = f"{registry_host}/{real_base}"
    text = (REPO / "matrix.toml").read_text()
    for old, new in ((real.package("torch").index, torch_index),
                     (real.package("flashinfer-jit-cache").index, flashinfer_index),
                     (real.package("sgl-kernel").url, sgl_kernel_url),
                     (f'image = "{real_base}"', f'image = "{base_image}"')):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    text = _debian_base(text, base_image, archive)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "matrix.toml").write_text(text)
    link_project_files(directory)
    wheels = {}
    for path in [*on_default, *on_torch_index, *on_flashinfer_index, sgl_kernel]:
        name, version, _, _ = parse_wheel_filename(path.name)
        wheels[f"{name}=={version}"] = path
    return Cu130Project(directory, directory / "matrix.toml", CU130, default_index, torch_index,
                        flashinfer_index, sgl_kernel_url, base_image, wheels)


def cu130_env(project: Cu130Project, base_env: dict | None = None) -> dict:
    """`builder` run for the project: uv's and pip's default index on loopback (uv resolves, pip fills
    the wheel cache), the project's own lock, and a private uv cache and (empty) Docker config."""
    env = {key: value for key, value in (base_env or os.environ).items() if key != "BUILDER_LOCK"}
    (project.root / "docker-config").mkdir(exist_ok=True)
    return {**env, "CI": "true", "UV_DEFAULT_INDEX": project.default_index, "PIP_INDEX_URL": project.default_index,
            "UV_CACHE_DIR": str(project.root / "uv-cache"), "DOCKER_CONFIG": str(project.root / "docker-config")}
