"""The real stack rows resolved against the real package indexes."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from builder.config.matrix import load_matrix
from builder.errors import UserError
from builder.lock import resolve
from builder.lock import base_digest, debian_archive
from builder.lock.model import DEFAULT_INDEX
from builder.lock.resolution import lock_stacks

REPO = Path(__file__).resolve().parent.parent
MATRIX = load_matrix(REPO / "matrix.toml")
CU128 = MATRIX.stack("sglang-0.5.9-cu128")
CU130 = MATRIX.stack("sglang-0.5.9-cu130")

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cu128():
    return resolve.resolve(CU128)


def test_cu128_row_resolves_with_the_override_applied(cu128):
    found = {d.name: d for d in cu128.distributions}
    assert found["torch"].version == "2.9.1"
    assert found["sgl-kernel"].version == "0.3.21"
    assert found["flashinfer-python"].version == "0.6.4"  # sglang declares ==0.6.3: the override
    assert found["flashinfer-cubin"].version == "0.6.4"
    assert found["sglang"].version == "0.5.9"
    assert cu128.python == "3.12" and cu128.indexes == () and cu128.index_strategy == "first-index"
    for dist in cu128.distributions:
        assert len(dist.sha256) == 64 and int(dist.sha256, 16) >= 0, dist
        assert dist.sha256 in dist.hashes
        assert dist.wheel.endswith(".whl")
        assert dist.source == DEFAULT_INDEX


def test_cu128_groups(cu128):
    groups = {d.name: d.group for d in cu128.distributions}
    assert groups["torch"] == groups["triton"] == groups["nvidia-nccl-cu12"] == groups["nvidia-cublas-cu12"] == "torch"
    assert groups["sgl-kernel"] == groups["flashinfer-python"] == groups["flashinfer-cubin"] == "kernels"
    assert groups["sglang"] == groups["fastapi"] == "sglang"
    assert set(groups.values()) == {"torch", "kernels", "sglang"}
    # torch's CUDA 12 libraries all install with torch; flashinfer's nvidia-* helpers with the kernels.
    assert all(group == "torch" for name, group in groups.items() if name.endswith("-cu12"))
    assert groups["nvidia-cudnn-frontend"] == groups["nvidia-cutlass-dsl"] == "kernels"


def test_recorded_sha256_is_the_wheels(cu128, tmp_path):
    """The hash the lock records is the sha256 of the file pip downloads for that pin."""
    sglang = next(d for d in cu128.distributions if d.name == "sglang")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--dest", str(tmp_path), "sglang==0.5.9"], check=True, capture_output=True)
    wheel = tmp_path / sglang.wheel
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == sglang.sha256


def test_cu128_without_the_override_does_not_resolve():
    with pytest.raises(UserError) as failure:
        resolve.resolve(dataclasses.replace(CU128, overrides=()))
    message = str(failure.value)
    assert message.startswith("sglang-0.5.9-cu128: uv found no resolution: ")
    assert "flashinfer" in message


def _reachable(url: str) -> bool:
    try:
        socket.getaddrinfo(urlsplit(url).hostname, 443)
    except OSError:
        return False
    return True


def test_cu130_row_fails_on_the_unreachable_indexes_and_locks_nothing(tmp_path):
    torch_index = CU130.package("torch").index
    if _reachable(torch_index):
        pytest.skip("PyTorch's index is reachable from here")
    path = tmp_path / "matrix.lock"
    with pytest.raises(UserError) as failure:
        lock_stacks([CU128, CU130], path=path, base_resolver=base_digest.resolve, apt_resolver=debian_archive.resolve)
    message = str(failure.value)
    assert message.startswith("sglang-0.5.9-cu130: ") and message.endswith("; nothing was locked")
    assert f"cannot reach package index {torch_index} (host name does not resolve)" in message
    assert f"cannot reach wheel URL {CU130.package('sgl-kernel').url} (host name does not resolve)" in message
    assert "\n" not in message
    assert not path.exists()  # cu128 resolved first, and still nothing was written
