"""compat_data.toml against the real index and the real wheels' metadata."""

from __future__ import annotations

import zipfile
from email.parser import Parser

import pytest
import requests
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from pip._internal.models.index import PyPI

from builder.config.compat import compat_data
from builder.patches.patch_series import fetch_wheel

pytestmark = pytest.mark.network


def index_wheels(name: str, version: str) -> list[str]:
    """x86_64 Linux wheel file names of a release, from the default index's JSON simple API."""
    response = requests.get(f"{PyPI.simple_url}/{name}/", timeout=60,
                            headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    response.raise_for_status()
    names = [f["filename"] for f in response.json()["files"] if f["filename"].endswith(".whl")]
    return [n for n in names if str(parse_wheel_filename(n)[1]) == version
            and any("x86_64" in t.platform or t.platform == "any" for t in parse_wheel_filename(n)[3])]


def wheel_metadata(name: str, version: str):
    wheel = fetch_wheel(name, version)
    with zipfile.ZipFile(wheel) as archive:
        member = next(m for m in archive.namelist() if m.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(member).decode())


DEFAULT_INDEX_TAGS = [
    (name, version, tags)
    for name, versions in compat_data()["wheel_tags"].items()
    for version, tags in versions.items()
    if name != "flashinfer-jit-cache"  # served by FlashInfer's own index, not reachable here
]


@pytest.mark.parametrize("name,version,tags", DEFAULT_INDEX_TAGS, ids=lambda v: str(v))
def test_wheel_tags_match_the_index(name, version, tags):
    published = sorted({f"{t.interpreter}-{t.abi}" for n in index_wheels(name, version)
                        for t in parse_wheel_filename(n)[3]})
    assert published == sorted(tags)


def test_declared_requirements_match_sglang_metadata():
    declared = compat_data()["declared"]["sglang==0.5.9"]
    requirements = [Requirement(r) for r in wheel_metadata("sglang", "0.5.9").get_all("Requires-Dist")]
    pinned = {canonicalize_name(r.name): str(r.specifier) for r in requirements if r.marker is None}
    assert {name: pinned[name] for name in declared} == declared


def test_default_index_torch_is_the_cuda_12_8_build():
    requirements = [Requirement(r) for r in wheel_metadata("torch", "2.9.1").get_all("Requires-Dist")]
    runtime = next(r for r in requirements if r.name == "nvidia-cuda-runtime-cu12")
    (specifier,) = runtime.specifier
    assert ".".join(specifier.version.split(".")[:2]) == compat_data()["default_index_cuda"]["torch"]["2.9.1"]
