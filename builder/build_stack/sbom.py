"""A CycloneDX SBOM of the whole image: the Python distributions, the Debian packages and the base.

What is installed is asked of the image itself, not assumed from the lock: the Python distributions
through importlib.metadata under the image's Python, the Debian (or Ubuntu) packages from its dpkg
status file, read out of a container that is created but never started (of the image the container API
holds, or on a root assembled from the builder's layout: engine/image_container.py). The lock adds each
wheel's sha256 and install group where name and version agree, and names the base image with its digest.
Written beside the build report and referenced from the lock. Deterministic: the serial number
derives from the image id, the timestamp is SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import docker
import docker.errors
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from builder.base import dpkg
from builder.engine.container_exit import exit_status
from builder.engine.daemon import docker_client
from builder.engine.image_container import ContainerRequest, ImageSource, as_source
from builder.errors import BuildFailure, UserError
from builder.files import write_atomic
from builder.lock.model import Distribution, LockedBase, Resolution
from builder.paths import VENV_PYTHON

DPKG_STATUS = "/var/lib/dpkg/status"
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")
# Runs under the image's Python: standard library only. One [name, version, sha256|null] per
# distribution; the sha256 comes from direct_url.json where the installer recorded one.
QUERY = """\
import importlib.metadata as metadata, json
rows = []
for dist in metadata.distributions():
    sha256 = None
    try:
        info = json.loads(dist.read_text("direct_url.json") or "null") or {}
        sha256 = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")
    except ValueError:
        pass
    rows.append([dist.metadata["Name"], dist.version, sha256])
print(json.dumps(sorted(rows, key=lambda row: (row[0].lower(), row[1]))))
"""


def installed_distributions(image: str | ImageSource, client: docker.DockerClient, python: str = VENV_PYTHON,
                            labels: dict[str, str] | None = None) -> list[tuple]:
    """(name, version, sha256 or None) of every distribution the image's Python sees."""
    source = as_source(image)
    try:
        with source.container(client, ContainerRequest(("-c", QUERY), (python,), labels=labels or {})) as container:
            container.start()
            status = exit_status(container)
            output = container.logs(stdout=True, stderr=False)
            if status != 0:
                tail = container.logs(stdout=False, stderr=True).decode(errors="replace").strip().splitlines()[-1:]
                raise BuildFailure(f"{source.name}: listing its Python distributions failed: "
                                   f"{' '.join(tail) or f'exit status {status}'}")
    except docker.errors.ImageNotFound:
        raise UserError(f"image {source.name} is not where the build's Docker API looks") from None
    except docker.errors.APIError as error:
        raise BuildFailure(f"{source.name}: cannot run {python} in it: {error.explanation or error}") from None
    try:
        rows = json.loads(output.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildFailure(f"{source.name}: unexpected output listing its distributions: {output[:200]!r}") from None
    return [(name, version, sha256) for name, version, sha256 in rows]


def _read_file(container, path: str) -> str | None:
    """A regular file's text from a container's filesystem; None when it is absent or not a file."""
    try:
        chunks, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        member = archive.next()
        if member is None or not member.isfile():
            return None
        return archive.extractfile(member).read().decode("utf-8", "replace")


def image_files(image: str | ImageSource, client: docker.DockerClient, paths: tuple[str, ...],
                python: str = VENV_PYTHON, labels: dict[str, str] | None = None) -> dict[str, str | None]:
    """The text of each path in the image, read from a container that is created, never started. Its
    program is the image's Python: podman copies out of an assembled root only once the runtime has
    found the container's program there (engine/rootfs_container.py)."""
    source = as_source(image)
    try:
        with source.container(client, ContainerRequest((python,), (), labels=labels or {})) as container:
            return {path: _read_file(container, path) for path in paths}
    except docker.errors.ImageNotFound:
        raise UserError(f"image {source.name} is not in the Docker daemon") from None
    except docker.errors.APIError as error:
        raise BuildFailure(f"{source.name}: cannot read its files: {error.explanation or error}") from None


def parse_os_release(text: str) -> dict[str, str]:
    release = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            release[key.strip()] = value.strip().strip("\"'")
    return release


def system_packages(image: str | ImageSource, client: docker.DockerClient, python: str = VENV_PYTHON,
                    labels: dict[str, str] | None = None) -> list[Component]:
    """The image's dpkg-installed packages as components (purl pkg:deb/<distribution>/...); none
    when the image has no dpkg status file."""
    files = image_files(image, client, (DPKG_STATUS, *OS_RELEASE), python, labels)
    if not files[DPKG_STATUS]:
        return []
    release = parse_os_release(next((files[p] for p in OS_RELEASE if files[p]), ""))
    distribution = release.get("ID", "debian")
    qualifiers = {"distro": f"{distribution}-{release['VERSION_ID']}"} if release.get("VERSION_ID") else {}
    components = []
    for fields in sorted(dpkg.installed(files[DPKG_STATUS]), key=lambda f: (f["Package"], f.get("Architecture", ""))):
        purl = PackageURL("deb", namespace=distribution, name=fields["Package"], version=fields.get("Version"),
                          qualifiers={"arch": fields.get("Architecture", ""), **qualifiers})
        properties = [Property(name="builder:source", value="dpkg")]
        if fields.get("Source"):
            properties.append(Property(name="builder:deb-source", value=fields["Source"]))
        components.append(Component(
            name=fields["Package"], version=fields.get("Version"), type=ComponentType.LIBRARY, purl=purl,
            bom_ref=purl.to_string(), properties=properties,
        ))
    return components


def base_image(base: LockedBase | None) -> Component | None:
    """The image the stack was built FROM, as the lock records it: reference and pinning digest."""
    if base is None or not base.image:
        return None
    reference = base.image
    repository, tag = reference.rsplit(":", 1) if ":" in reference.rsplit("/", 1)[-1] else (reference, "")
    qualifiers = {"repository_url": repository, **({"tag": tag} if tag else {})}
    digest = base.pin or None
    purl = PackageURL("oci", name=repository.rsplit("/", 1)[-1], version=digest, qualifiers=qualifiers)
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=digest.removeprefix("sha256:"))] if digest else []
    return Component(
        name=base.image, version=digest, type=ComponentType.CONTAINER, purl=purl, bom_ref=f"base:{base.image}",
        hashes=hashes, properties=[Property(name="builder:base", value=base.name),
                                   Property(name="builder:pinned", value="true" if digest else "false")],
    )


def build_bom(stack: str, image_id: str, installed: list[tuple], locked: tuple[Distribution, ...], source_date_epoch: int,
              system: list[Component] = (), base: Component | None = None) -> Bom:
    """The SBOM: the image as the described component, each distribution and system package a library
    depending from it, and the base image it was built from."""
    bom = Bom(serial_number=serial_number(stack, image_id))
    bom.metadata.timestamp = datetime.fromtimestamp(source_date_epoch, tz=timezone.utc)
    image = Component(name=stack, version=image_id, type=ComponentType.CONTAINER, bom_ref=f"image:{stack}")
    bom.metadata.component = image
    by_name = {d.name: d for d in locked}
    components = []
    for name, version, image_sha in sorted({(canonicalize_name(n), v, s) for n, v, s in installed}):
        entry = by_name.get(name)
        in_lock = entry is not None and entry.version == version
        sha256 = image_sha or (entry.sha256 if in_lock else None)
        purl = PackageURL("pypi", name=name, version=version)
        properties = [Property(name="builder:locked", value="true" if in_lock else "false")]
        if in_lock:
            properties.append(Property(name="builder:group", value=entry.group))
            properties.append(Property(name="builder:wheel", value=entry.wheel))
        component = Component(
            name=name, version=version, type=ComponentType.LIBRARY, purl=purl, bom_ref=purl.to_string(),
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha256)] if sha256 else [],
            properties=properties,
        )
        bom.components.add(component)
        components.append(component)
    for component in [*system, *([base] if base else [])]:
        bom.components.add(component)
        components.append(component)
    bom.register_dependency(image, components)
    return bom


def serial_number(stack: str, image_id: str) -> uuid.UUID:
    """The SBOM's serial names the image it describes: the same image, the same serial."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"builder-sbom:{stack}:{image_id}")


def made_for(path: Path, stack: str, image_id: str) -> bool:
    """Whether the SBOM at `path` describes this very image (its serial number says so)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("serialNumber") == serial_number(stack, image_id).urn


def sbom_path(report_path: str | Path) -> Path:
    """build-reports/<stack>.json -> build-reports/<stack>.cdx.json"""
    report_path = Path(report_path)
    return report_path.with_name(report_path.stem + ".cdx.json")


@dataclass(frozen=True)
class Inventory:
    """What the image itself says is installed: its Python's distributions and its dpkg packages."""
    installed: list[tuple]
    system: list[Component]


def take_inventory(image: str | ImageSource, client: docker.DockerClient, python: str = VENV_PYTHON,
                   labels: dict[str, str] | None = None) -> Inventory:
    """`labels` mark its containers as a run's, so what a run that died left can be found."""
    return Inventory(installed_distributions(image, client, python, labels),
                     system_packages(image, client, python, labels))


def write_bom(path: Path, stack: str, image_id: str, locked: Resolution,
              client: docker.DockerClient | None = None, python: str = VENV_PYTHON, reuse: bool = False,
              inventory: Inventory | None = None) -> Path:
    """SBOM of a built image: what its Python and its dpkg status list (`inventory`, taken here when not
    given), with the lock entry's hashes, groups and base image; returns its path. With `reuse`, an SBOM
    already made for this image id is kept: the id is the image's content, and the lock entry that made
    it is in that content (its requirement files), so asking the image again could only repeat the answer."""
    if reuse and made_for(path, stack, image_id):
        return path
    taken = inventory or take_inventory(image_id, client or docker_client(), python)
    bom = build_bom(stack, image_id, taken.installed, locked.distributions, locked.source_date_epoch,
                    taken.system, base_image(locked.base))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, JsonV1Dot6(bom).output_as_string(indent=2) + "\n")
    return path
