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

from builder.build_stack import sbom
from builder.config.matrix import load_matrix
from builder.errors import BuildFailure
from builder.lock import store
from builder.lock.model import Distribution
from builder.lock.resolution import lock_stacks, record_base
from builder.lock.resolve import PLATFORM, WheelResolution
from lock_values import base_digest_of, system_packages_of

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
    locked = (
        Distribution("torch", "2.9.1", "a" * 64, "torch-2.9.1-cp312.whl", ("a" * 64,), "default index", "torch"),
        Distribution("sglang", "0.5.9", "b" * 64, "sglang-0.5.9.whl", ("b" * 64,), "default index", "sglang"),
    )
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


class NoDocker:
    """A client no call may reach: any attribute asked for fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the SBOM asked the image again ({name})")


def test_an_sbom_made_for_this_image_is_kept_and_one_for_another_is_not(tmp_path):
    """The committed SBOM of each local row names its image by serial; a build of that very image keeps it
    (no container runs), --resmoke (reuse=False) and any other image id do not."""
    lock = store.read(REPO / "matrix.lock")
    for name in ("sglang-0.5.9-cu128-local", "sglang-0.5.23-cu130-local"):
        committed = REPO / "build-reports" / f"{name}.cdx.json"
        image_id = lock.get(name).outcome.image.image_id
        assert sbom.made_for(committed, name, image_id)
        assert not sbom.made_for(committed, name, "sha256:" + "0" * 64)
        assert not sbom.made_for(committed, "another-row", image_id)
        copy = tmp_path / f"{name}.cdx.json"
        copy.write_bytes(committed.read_bytes())
        resolution = lock.get(name).resolution
        assert sbom.write_bom(copy, name, image_id, resolution, client=NoDocker(), reuse=True) == copy
        assert copy.read_bytes() == committed.read_bytes()
        with pytest.raises(AssertionError, match="asked the image again"):
            sbom.write_bom(copy, name, "sha256:" + "0" * 64, resolution, client=NoDocker(), reuse=True)
        with pytest.raises(AssertionError, match="asked the image again"):
            sbom.write_bom(copy, name, image_id, resolution, client=NoDocker(), reuse=False)
    (tmp_path / "damaged.cdx.json").write_text("{not json")
    assert not sbom.made_for(tmp_path / "damaged.cdx.json", "row", "sha256:" + "0" * 64)
    assert not sbom.made_for(tmp_path / "absent.cdx.json", "row", "sha256:" + "0" * 64)


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

    resolution = WheelResolution(STACK.python, PLATFORM, (), "first-index", (
        locked_distribution("jinja2", "0.0.1"),  # not what the image holds
        locked_distribution("packaging", versions["packaging"]),
    ))
    path = tmp_path / "matrix.lock"
    lock_stacks([STACK], path=path, resolver=lambda s: resolution, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    target = sbom.sbom_path(tmp_path / "build-reports" / f"{STACK.name}.json")
    written = sbom.write_bom(target, STACK.name, image_id, store.entry(STACK.name, path).resolution, client=client)
    assert written == tmp_path / "build-reports" / f"{STACK.name}.cdx.json"
    text = written.read_text()
    validate(text)
    every = json.loads(text)["components"]
    components = {c["name"]: c for c in every if c["purl"].startswith("pkg:pypi/")}
    assert sorted(components) == ["jinja2", "markupsafe", "packaging"]
    # This image has no dpkg status: no system packages. The base is the lock's, with the digest it resolved.
    assert [c for c in every if c["purl"].startswith("pkg:deb/")] == []
    base = next(c for c in every if c["type"] == "container")
    digest = base_digest_of(STACK.base.image)
    assert base["name"] == STACK.base.image and base["version"] == digest
    assert base["purl"] == (f"pkg:oci/cuda@{digest}?repository_url=nvidia/cuda&tag=12.8.1-cudnn-devel-ubuntu24.04")
    assert components["packaging"]["hashes"][0]["content"] == resolution.distributions[1].sha256
    assert "hashes" not in components["jinja2"] and "hashes" not in components["markupsafe"]
    assert components["jinja2"]["version"] == versions["jinja2"]


@pytest.mark.engine
def test_an_image_without_the_venv_python_is_a_clear_error(python_image):
    client, image_id = python_image
    before = {c.id for c in client.containers.list(all=True)}
    with pytest.raises(BuildFailure, match=rf"^{image_id}: cannot run /no/python in it"):
        sbom.installed_distributions(image_id, client, python="/no/python")
    assert {c.id for c in client.containers.list(all=True)} == before  # the failed container is gone


# --- the whole image: a real Debian base, torch's real metadata in the venv ----------------------


@pytest.fixture(scope="module")
def debian_torch_image(base_image):
    """The mmdebstrap base (real dpkg status, Debian's python3) with /opt/venv holding the metadata of
    the torch distribution installed here: made by committing a container, no build engine needed."""
    client = docker.from_env()
    python = "python3.11"
    dist_info = Path(importlib.metadata.distribution("torch")._path)  # noqa: SLF001 - where pip put it
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        cfg = b"home = /usr/bin\ninclude-system-site-packages = false\n"
        info = tarfile.TarInfo("opt/venv/pyvenv.cfg")
        info.size = len(cfg)
        archive.addfile(info, io.BytesIO(cfg))
        link = tarfile.TarInfo("opt/venv/bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, f"/usr/bin/{python}"
        archive.addfile(link)
        for path in sorted([dist_info, *dist_info.rglob("*")]):
            archive.add(path, arcname=f"opt/venv/lib/{python}/site-packages/{path.relative_to(dist_info.parent)}",
                        recursive=False)
    container = client.containers.create(base_image.tag, command=["true"])
    try:
        container.put_archive("/", buffer.getvalue())
        image = container.commit(repository=f"builder-sbom-debian-{uuid.uuid4().hex[:8]}", tag="1")
    finally:
        container.remove(force=True)
    yield client, image.id, base_image
    client.images.remove(image.id, force=True)


@pytest.mark.engine
def test_the_sbom_lists_debian_packages_torch_and_the_base_with_its_digest(debian_torch_image, tmp_path):
    client, image_id, base = debian_torch_image
    path = tmp_path / "matrix.lock"
    local = load_matrix(REPO / "matrix.toml").stack("sglang-0.5.9-cu128-local")
    torch_version = importlib.metadata.version("torch")
    resolution = WheelResolution(local.python, PLATFORM, (), "first-index",
                            (locked_distribution("torch", torch_version, "torch"),))
    lock_stacks([local], path=path, resolver=lambda s: resolution, base_resolver=base_digest_of, apt_resolver=system_packages_of)
    record_base(local.base.name, base.image_id, path=path)

    written = sbom.write_bom(tmp_path / "r.cdx.json", local.name, image_id, store.entry(local.name, path).resolution, client=client)
    text = written.read_text()
    validate(text)
    document = json.loads(text)
    by_purl = {c["purl"].split("@")[0]: c for c in document["components"]}
    assert by_purl["pkg:pypi/torch"]["version"] == torch_version
    assert by_purl["pkg:pypi/torch"]["hashes"] == [{"alg": "SHA-256", "content": resolution.distributions[0].sha256}]
    python3 = by_purl["pkg:deb/debian/python3"]
    assert python3["purl"].startswith("pkg:deb/debian/python3@3.11.") and "distro=debian-12" in python3["purl"]
    packages = base.packages  # "name=version" as mmdebstrap installed them
    assert f"python3={python3['version']}" in packages
    debs = [c for c in document["components"] if c["purl"].startswith("pkg:deb/")]
    assert len(debs) == len(packages)
    container = next(c for c in document["components"] if c["type"] == "container")
    assert container["name"] == local.base.image and container["version"] == base.image_id
    assert container["hashes"] == [{"alg": "SHA-256", "content": base.image_id.removeprefix("sha256:")}]
    # The image depends on every component.
    image_ref = document["metadata"]["component"]["bom-ref"]
    depends = next(d["dependsOn"] for d in document["dependencies"] if d["ref"] == image_ref)
    assert len(depends) == len(document["components"])
