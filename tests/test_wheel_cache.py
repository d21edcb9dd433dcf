"""The content-keyed wheel cache: filled once per sha256 by real pip, checked, linked into a context.

Wheels here are real (built by the test as zip files with dist-info, the format pip reads) and come
through a file URL, the `url =` source kind, so no index is needed; the default-index path is the
`network` test at the end.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from builder.cache import wheel_cache
from builder.errors import BuildFailure, UserError
from builder.lock import store
from builder.lock.model import Distribution, LockedBase, Resolution
from tests.checkouts import REPO


def make_wheel(directory: Path, name: str, version: str, payload: str = "VALUE = 1\n") -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL, RECORD with hashes)."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{name}/__init__.py": payload.encode(),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{member},sha256={digest},{len(data)}")
    record_lines.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def url_entry(wheels: list[Path], python: str = "3.11") -> Resolution:
    """A resolution whose distributions all come from direct file URLs."""
    distributions = []
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        distributions.append(Distribution(name, version, sha256(wheel), wheel.name, (sha256(wheel),),
                                          wheel.as_uri(), "sglang", wheel.as_uri()))
    base = LockedBase("debian-bookworm", "localhost/builder-base:debian-bookworm", True)
    return Resolution("row", "0" * 64, python, "x86_64-manylinux_2_28", (), "first-index", (), base, 0,
                      tuple(distributions))


@pytest.fixture
def served(tmp_path: Path) -> tuple[list[Path], dict]:
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    wheels = [make_wheel(upstream, "alpha", "1.0"), make_wheel(upstream, "beta", "2.0")]
    return wheels, url_entry(wheels)


def test_fill_downloads_each_wheel_once_and_keys_it_by_content(tmp_path, served):
    wheels, entry = served
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    locked = wheel_cache.locked_wheels(entry)

    first = cache.fill(locked, entry.python, "row")
    second = cache.fill(locked, entry.python, "row")

    assert (first.downloaded, first.downloaded_bytes) == (2, sum(w.stat().st_size for w in wheels))
    assert (second.downloaded, second.downloaded_bytes) == (0, 0)
    for wheel in wheels:
        stored = tmp_path / "cache" / "sha256" / sha256(wheel) / wheel.name
        assert stored.read_bytes() == wheel.read_bytes()
    assert cache.missing(locked) == []


def test_a_tampered_wheel_is_refused_and_never_enters_the_cache(tmp_path, served):
    wheels, entry = served
    wheels[1].write_bytes(make_wheel(tmp_path, "beta", "2.0", payload="VALUE = 666\n").read_bytes())
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    locked = wheel_cache.locked_wheels(entry)

    with pytest.raises(BuildFailure) as failure:
        cache.fill(locked, entry.python, "row")

    message = str(failure.value)
    assert "\n" not in message and "beta==2.0" in message and "alpha" not in message
    assert "sha256 differs" in message
    assert [w.name for w in cache.missing(locked)] == ["beta"]  # alpha, which matched, was kept


def test_more_wheels_than_parallel_runs_all_arrive_and_a_bad_one_is_named_alone(tmp_path):
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    names = [f"pkg{i}" for i in range(wheel_cache._PARALLEL_DOWNLOADS + 3)]
    wheels = [make_wheel(upstream, name, "1.0") for name in names]
    entry = url_entry(wheels)
    locked_bytes = wheels[-2].read_bytes()
    wheels[-2].write_bytes(make_wheel(tmp_path, names[-2], "1.0", payload="VALUE = 666\n").read_bytes())
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    locked = wheel_cache.locked_wheels(entry)

    with pytest.raises(BuildFailure) as failure:
        cache.fill(locked, entry.python, "row")

    assert f"1 locked wheels could not be fetched ({names[-2]}==1.0)" in str(failure.value)
    assert [w.name for w in cache.missing(locked)] == [names[-2]]
    wheels[-2].write_bytes(locked_bytes)
    report = cache.fill(locked, entry.python, "row")
    assert (report.downloaded, cache.missing(locked)) == (1, [])


def test_a_checked_wheel_is_not_read_again_for_its_digest_and_a_changed_one_is_refused(tmp_path, served,
                                                                                         monkeypatch):
    _, entry = served
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    locked = wheel_cache.locked_wheels(entry)
    cache.fill(locked, entry.python, "row")
    alpha, beta = (cache.path(wheel) for wheel in locked)

    def unread(path):
        raise AssertionError(f"{path} read again")

    with monkeypatch.context() as patched:
        patched.setattr(wheel_cache.content_check, "sha256_file", unread)
        patched.setattr(wheel_cache, "sha256_file", unread)
        assert cache.checked_digest(alpha) == locked[0].sha256

    beta.write_bytes(b"Q" + beta.read_bytes()[1:])
    os.utime(beta, ns=(1, 1))  # same size, another time: its record no longer holds
    assert cache.checked_digest(beta) != locked[1].sha256
    assert not beta.exists()
    outside = tmp_path / "elsewhere.whl"
    outside.write_bytes(b"x")
    assert cache.checked_digest(outside) == hashlib.sha256(b"x").hexdigest()


def test_offline_names_the_wheels_the_cache_lacks(tmp_path, served):
    _, entry = served
    cache = wheel_cache.WheelCache(tmp_path / "empty")
    with pytest.raises(UserError) as failure:
        cache.require(wheel_cache.locked_wheels(entry), "row")
    message = str(failure.value)
    assert "\n" not in message
    assert "lacks 2 of 2" in message and "alpha==1.0" in message and "beta==2.0" in message
    assert "builder fetch" in message


def test_link_into_makes_a_flat_directory_of_hard_links(tmp_path, served):
    wheels, entry = served
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    locked = wheel_cache.locked_wheels(entry)
    cache.fill(locked, entry.python, "row")

    view = tmp_path / "context" / "wheels"
    cache.link_into(locked, view)

    assert sorted(p.name for p in view.iterdir()) == sorted(w.name for w in wheels)
    for wheel in locked:
        assert os.stat(view / wheel.filename).st_ino == os.stat(cache.path(wheel)).st_ino


def test_platform_options_name_every_tag_the_locked_files_carry():
    wheels = [
        wheel_cache.LockedWheel("sgl-kernel", "0.3.21", "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl",
                                "0" * 64, "default index"),
        wheel_cache.LockedWheel("pyzmq", "27.3.0", "pyzmq-27.3.0-cp311-cp311-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl",
                                "1" * 64, "default index"),
        wheel_cache.LockedWheel("idna", "3.20", "idna-3.20-py3-none-any.whl", "2" * 64, "default index"),
    ]
    options = wheel_cache._platform_options(wheels)
    platforms = [options[i + 1] for i, option in enumerate(options) if option == "--platform"]
    assert platforms == ["manylinux2014_x86_64", "manylinux_2_26_x86_64", "manylinux_2_28_x86_64"]


@pytest.mark.network
def test_the_committed_lock_fills_from_the_default_index(tmp_path):
    """Two real locked wheels of the cu128 row, one pure and one manylinux2014-only platform wheel
    for CPython 3.11, fetched by pip from its default index and matched by sha256."""
    resolution = store.entry("sglang-0.5.9-cu128-local", REPO / "matrix.lock").resolution
    chosen = {"idna", "msgspec"}
    subset = dataclasses.replace(resolution, distributions=tuple(d for d in resolution.distributions if d.name in chosen))
    cache = wheel_cache.WheelCache(tmp_path / "cache")
    report = cache.fill(wheel_cache.locked_wheels(subset), subset.python, "cu128")
    assert report.downloaded == 2
    for item in subset.distributions:
        assert sha256(tmp_path / "cache" / "sha256" / item.sha256 / item.wheel) == item.sha256
