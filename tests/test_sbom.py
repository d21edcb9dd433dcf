"""CycloneDX SBOMs: built from what an image's own Python reports, hashes from the lock."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import uuid
from pathlib import Path

import docker
import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from builder.image import sbom
from builder.publish import lock
from builder.errors import BuildFailure
from builder.config.matrix import load_matrix
from builder.publish.resolve import PLATFORM, Distribution, Resolution

REPO = Path(__file__).resolve().parent.parent
STACK = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128")
EPOCH = STACK.source_date_epoch
# Real distributions installed here; their metadata goes into the test image's venv.
IN_IMAGE = ("packaging", "jinja2", "markupsafe")


def validate(text: str) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    assert error is None, error


def locked_distribution(name: str, version: str, group: str = "sglang") -> Distribution:
    sha = (name.encode().hex() * 64)[:64]
    return Distribution(name, version, sha, f"{name}-{version}-py3-none-any.whl", (sha,), "default index", group)


def test_bom_components_hashes_and_lock_agreement():
    locked = {
        "torch": {"version": "2.9.1", "sha256": "a" * 64, "group": "torch", "wheel": "torch-2.9.1-cp312.whl"},
        "sglang": {"version": "0.5.9", "sha256": "b" * 64, "group": "sglang", "wheel": "sglang-0.5.9.whl"},
    }
    installed = [("torch", "2.9.1", None), ("SGLang", "0.5.8", None), ("pip", "25.0", None),
                 ("demo-url", "1.0", "c" * 64), ("torch", "2.9.1", None)]
    bom = sbom.build_bom(STACK.name, "sha256:" + "f" * 64, installed, locked, EPOCH)
    text = sbom.JsonV1Dot6(bom).output_as_string(indent=2)
    validate(text)
    document = json.loads(text)
    components = {c["name"]: c for c in document["components"]}
    assert sorted(components) == ["demo-url", "pip", "sglang", "torch"]
    torch = components["torch"]
    assert torch["purl"] == "pkg:pypi/torch@2.9.1"
    assert torch["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert {p["name"]: p["value"] for p in torch["properties"]} == {
        "builder:locked": "true", "builder:group": "torch", "builder:wheel": "torch-2.9.1-cp312.whl"}
    # The image holds another sglang than the lock: no lock hash is claimed for it.
    assert "hashes" not in components["sglang"] and components["sglang"]["version"] == "0.5.8"
    assert {p["name"]: p["value"] for p in components["sglang"]["properties"]} == {"builder:locked": "false"}
    assert components["demo-url"]["hashes"] == [{"alg": "SHA-256", "content": "c" * 64}]
    assert document["metadata"]["timestamp"] == "2026-01-01T00:00:00+00:00"
    assert document["metadata"]["component"]["type"] == "container"
    # Same inputs, same bytes.
    again = sbom.JsonV1Dot6(sbom.build_bom(STACK.name, "sha256:" + "f" * 64, installed, locked, EPOCH))
    assert again.output_as_string(indent=2) == text


def test_sbom_path_sits_beside_the_report():
    assert sbom.sbom_path("build-reports/sglang-0.5.9-cu128.json") == Path("build-reports/sglang-0.5.9-cu128.cdx.json")


# --- against a real image -------------------------------------------------------------------


def _python_rootfs() -> bytes:
    """A tar of this host's Python interpreter, its shared libraries and standard library, plus
    /opt/venv holding the metadata of a few distributions installed here: the image layout the
    builder makes (/opt/venv/bin/python), small enough to import in seconds."""
    executable = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo",
            "ensurepip", "__pycache__", "lib2to3", "pydoc_data"}
    shared = sorted(p for p in stdlib.rglob("*.so") if not skip & set(p.parts))
    libraries = set()
    for binary in [executable, *shared]:
        listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in listing.splitlines():
            parts = line.split()
            for part in parts:
                if part.startswith("/") and Path(part).exists():
                    libraries.add(Path(part))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        def add(path: Path, name: str | None = None):
            archive.add(path, arcname=(name or str(path)).lstrip("/"), recursive=False)

        for library in sorted(libraries):
            add(library.resolve(), str(library))
        add(executable)
        for path in sorted(stdlib.rglob("*")):
            if not skip & set(path.relative_to(stdlib).parts) and (path.is_file() or path.is_dir()):
                add(path)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        venv = {
            "opt/venv/pyvenv.cfg": f"home = {executable.parent}\ninclude-system-site-packages = false\n",
        }
        for name, text in venv.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
        link = tarfile.TarInfo("opt/venv/bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, str(executable)
        archive.addfile(link)
        for name in IN_IMAGE:
            dist_info = Path(importlib.metadata.distribution(name)._path)  # noqa: SLF001 - where pip put it
            for path in sorted([dist_info, *dist_info.rglob("*")]):
                add(path, f"/opt/venv/lib/{version}/site-packages/{path.relative_to(dist_info.parent)}")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def python_image():
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:
        pytest.fail(f"Docker daemon not running ({error}); scripts/setup-host starts it")
    repository = f"builder-sbom-test-{uuid.uuid4().hex[:8]}"
    client.api.import_image_from_data(_python_rootfs(), repository=repository, tag="1")
    image = client.images.get(f"{repository}:1")
    yield client, image.id
    client.images.remove(image.id, force=True)


@pytest.mark.engine
def test_sbom_of_a_real_image_written_with_the_locked_hashes(python_image, tmp_path):
    client, image_id = python_image
    versions = {name: importlib.metadata.version(name) for name in IN_IMAGE}
    installed = sbom.installed_distributions(image_id, client)
    assert sorted((name.lower(), version) for name, version, _ in installed) == sorted(versions.items())

    resolution = Resolution(STACK.python, PLATFORM, (), "first-index", (
        locked_distribution("jinja2", "0.0.1"),  # not what the image holds
        locked_distribution("packaging", versions["packaging"]),
    ))
    path = tmp_path / "matrix.lock"
    lock.lock_stacks([STACK], path=path, resolver=lambda s: resolution)
    target = sbom.sbom_path(tmp_path / "build-reports" / f"{STACK.name}.json")
    written = sbom.write_bom(target, STACK.name, image_id, lock.entry(STACK, path)["distributions"],
                             STACK.source_date_epoch, client=client)
    assert written == tmp_path / "build-reports" / f"{STACK.name}.cdx.json"
    text = written.read_text()
    validate(text)
    components = {c["name"]: c for c in json.loads(text)["components"]}
    assert sorted(components) == ["jinja2", "markupsafe", "packaging"]
    assert components["packaging"]["hashes"][0]["content"] == resolution.distributions[1].sha256
    assert "hashes" not in components["jinja2"] and "hashes" not in components["markupsafe"]
    assert components["jinja2"]["version"] == versions["jinja2"]


@pytest.mark.engine
def test_an_image_without_the_venv_python_is_a_clear_error(python_image):
    client, image_id = python_image
    with pytest.raises(BuildFailure, match=rf"^{image_id}: cannot run /no/python in it"):
        sbom.installed_distributions(image_id, client, python="/no/python")
