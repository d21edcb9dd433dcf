"""A CycloneDX SBOM of the Python distributions installed in an image.

What is installed is asked of the image itself (importlib.metadata under the image's Python, run
through the Docker daemon), not assumed from the lock; the lock adds each wheel's sha256 and install
group where name and version agree. Written beside the build report and referenced from the lock.
Deterministic: the serial number derives from the image id, the timestamp is SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import json
import uuid
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

from builder.engine.daemon import docker_client
from builder.errors import BuildFailure, UserError
from builder.files import write_atomic
from builder.paths import VENV_PYTHON

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


def installed_distributions(image: str, client: docker.DockerClient, python: str = VENV_PYTHON) -> list[tuple]:
    """(name, version, sha256 or None) of every distribution the image's Python sees."""
    try:
        output = client.containers.run(image, ["-c", QUERY], entrypoint=[python], remove=True,
                                       network_disabled=True, stdout=True, stderr=True)
    except docker.errors.ImageNotFound:
        raise UserError(f"image {image} is not in the Docker daemon") from None
    except docker.errors.ContainerError as error:
        tail = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
        raise BuildFailure(f"{image}: listing its Python distributions failed: {' '.join(tail) or error}") from None
    except docker.errors.APIError as error:
        raise BuildFailure(f"{image}: cannot run {python} in it: {error.explanation or error}") from None
    try:
        rows = json.loads(output.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildFailure(f"{image}: unexpected output listing its distributions: {output[:200]!r}") from None
    return [(name, version, sha256) for name, version, sha256 in rows]


def build_bom(stack: str, image_id: str, installed: list[tuple], locked: dict, source_date_epoch: int) -> Bom:
    """The SBOM: the image as the described component, each distribution a library depending from it."""
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"builder-sbom:{stack}:{image_id}"))
    bom.metadata.timestamp = datetime.fromtimestamp(source_date_epoch, tz=timezone.utc)
    image = Component(name=stack, version=image_id, type=ComponentType.CONTAINER, bom_ref=f"image:{stack}")
    bom.metadata.component = image
    components = []
    for name, version, image_sha in sorted({(canonicalize_name(n), v, s) for n, v, s in installed}):
        entry = locked.get(name)
        in_lock = entry is not None and entry["version"] == version
        sha256 = image_sha or (entry["sha256"] if in_lock else None)
        purl = PackageURL("pypi", name=name, version=version)
        properties = [Property(name="builder:locked", value="true" if in_lock else "false")]
        if in_lock:
            properties.append(Property(name="builder:group", value=entry["group"]))
            properties.append(Property(name="builder:wheel", value=entry["wheel"]))
        component = Component(
            name=name, version=version, type=ComponentType.LIBRARY, purl=purl, bom_ref=purl.to_string(),
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha256)] if sha256 else [],
            properties=properties,
        )
        bom.components.add(component)
        components.append(component)
    bom.register_dependency(image, components)
    return bom


def sbom_path(report_path: str | Path) -> Path:
    """build-reports/<stack>.json -> build-reports/<stack>.cdx.json"""
    report_path = Path(report_path)
    return report_path.with_name(report_path.stem + ".cdx.json")


def write_bom(path: Path, stack: str, image_id: str, distributions: dict, source_date_epoch: int,
              client: docker.DockerClient | None = None, python: str = VENV_PYTHON) -> Path:
    """SBOM of a built image: what its Python sees, with the lock's hashes and groups; returns its path."""
    client = client or docker_client()
    installed = installed_distributions(image_id, client, python)
    bom = build_bom(stack, image_id, installed, distributions, source_date_epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, JsonV1Dot6(bom).output_as_string(indent=2) + "\n")
    return path
