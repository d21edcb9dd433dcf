"""Containers of an image the builder's layout holds, run by podman on a root assembled from the image's
layers (engine/rootfs_container.py): what the process gets from the image's config and from the caller,
the archive copies, the smoke gate and the SBOM's inventory on that path, and what is left afterwards."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import docker.errors
import pytest

from builder.build_stack import sbom
from builder.engine import overlay_mount, podman_service, rootfs_container
from builder.engine.container_exit import exit_status
from builder.engine.image_container import ContainerRequest, StoredImage
from builder.engine.ownership import OWNER_LABEL, Owner
from builder.errors import BuildFailure, UserError
from builder.oci.layout import Layout, digest_of
from builder.runtime.smoke import report as smoke_report
from builder.smoke import read_tracer, smoke_gate

pytestmark = pytest.mark.engine  # podman

REPO = Path(__file__).resolve().parents[1]

PROGRAMS = ("/bin/sh", "/usr/bin/id", "/bin/cat", "/usr/bin/env", "/bin/sleep")
USER_ID = 1234
SETTINGS = {"Env": ["PATH=/usr/bin:/bin", "GREETING=from-image", "SHADOWED=image"], "User": "app",
            "WorkingDir": "/home/app", "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo default-cmd"]}
# Stands in for the image's Python: the SBOM's query (-c) and the smoke program (-m) answer as theirs do,
# the smoke program writing one record where the read tracer (put in before the start) says.
PYTHON = """#!/bin/sh
case "$1" in
-c) echo '[["packaging", "24.0", null]]' ;;
-m) if [ -f /tmp/builder-reads/lib/sitecustomize.py ]; then echo "traced $*" > "$BUILDER_READS_OUT/1.reads"; fi
    echo "{\\"schema\\": 1, \\"stack\\": \\"tiny\\", \\"results\\": [{\\"check\\": \\"patches.none\\", \\
\\"status\\": \\"pass\\", \\"detail\\": \\"$(id -u) $(pwd) $PYTHONPATH\\"}]}" ;;
esac
"""
DPKG_STATUS = ("Package: base-files\nStatus: install ok installed\nArchitecture: amd64\nVersion: 12.4\n\n"
               "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n")
OS_RELEASE = 'ID=debian\nVERSION_ID="12"\n'


def _entry(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, owner: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, owner, owner, 1767225600
    return info


def _tar(fill) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        fill(archive)
    return buffer.getvalue()


def _add_text(archive: tarfile.TarFile, name: str, text: str, mode: int = 0o644, owner: int = 0) -> None:
    info = _entry(name, mode=mode, owner=owner)
    info.size = len(text.encode())
    archive.addfile(info, io.BytesIO(text.encode()))


def _host_programs(archive: tarfile.TarFile) -> None:
    """PROGRAMS and the libraries ldd names for them, each under the path asked for, its directories
    before it: the base layer."""
    paths = set()
    for program in PROGRAMS:
        paths.add(program)
        listing = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
        paths.update(word for line in listing.splitlines() for word in line.split()
                     if word.startswith("/") and os.path.exists(word))
    directories = {str(parent) for path in paths for parent in Path(path).parents if str(parent) != "/"}
    for directory in sorted(directories | {"/tmp", "/etc", "/home", "/proc", "/sys", "/dev"}):
        archive.addfile(_entry(directory, tarfile.DIRTYPE, 0o1777 if directory == "/tmp" else 0o755))
    for path in sorted(paths):
        with open(os.path.realpath(path), "rb") as handle:
            data = handle.read()
        info = _entry(path, mode=0o755)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


def _application(archive: tarfile.TarFile) -> None:
    """The top layer: a user of its own with a home, the stand-in Python, a dpkg status and os-release."""
    for directory in ("/var", "/var/lib", "/var/lib/dpkg", "/opt", "/opt/venv", "/opt/venv/bin"):
        archive.addfile(_entry(directory, tarfile.DIRTYPE, 0o755))
    archive.addfile(_entry("/home/app", tarfile.DIRTYPE, 0o755, USER_ID))
    _add_text(archive, "/etc/passwd", f"root:x:0:0:root:/root:/bin/sh\napp:x:{USER_ID}:{USER_ID}::/home/app:/bin/sh\n")
    _add_text(archive, "/etc/group", f"root:x:0:\napp:x:{USER_ID}:\n")
    _add_text(archive, "/etc/os-release", OS_RELEASE)
    _add_text(archive, "/var/lib/dpkg/status", DPKG_STATUS)
    _add_text(archive, "/opt/venv/bin/python", PYTHON, mode=0o755)


def write_image(layout: Layout, layers: list[bytes], settings: dict) -> str:
    """An image into `layout` as the build writes one: uncompressed layers, the config; its image id."""
    descriptors = [layout.write_blob(layer) for layer in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": settings,
                         "rootfs": {"type": "layers", "diff_ids": [d.digest for d in descriptors]}}).encode()
    layout.write_image(config, [d.as_json("application/vnd.oci.image.layer.v1.tar") for d in descriptors],
                       ref="tiny")
    return digest_of(config)


def _mounts_under(root: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(f"{root}/")]


@pytest.fixture(scope="module")
def write_once_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("write-once")
    yield root
    for point in sorted(_mounts_under(root), reverse=True):  # a failed test's leftovers, never a passing one's
        subprocess.run(["umount", point], check=False)


@pytest.fixture(scope="module")
def image_id(write_once_root):
    return write_image(Layout.create(write_once_root / "layout"), [_tar(_host_programs), _tar(_application)],
                       SETTINGS)


@pytest.fixture(scope="module")
def image(write_once_root, image_id):
    return rootfs_container.layout_image(write_once_root, image_id)


@pytest.fixture(scope="module")
def podman():
    """podman's service over a private, empty storage (under /tmp: its runroot path must be short)."""
    storage = Path(tempfile.mkdtemp(prefix="rootfs-", dir="/tmp"))
    try:
        with podman_service.serve(storage) as service:
            yield service.client(), storage
    finally:
        for point in sorted(_mounts_under(storage), reverse=True):  # the storage driver's own bind mount
            subprocess.run(["umount", point], check=False)
        shutil.rmtree(storage, ignore_errors=True)


@pytest.fixture
def client(podman, image):
    """The service's client; the test leaves no container, no image and no overlay behind."""
    client, _ = podman
    yield client
    assert client.containers.list(all=True) == []
    assert client.images.list() == []
    assert _mounts_under(image.scratch) == [] and list(image.scratch.glob("overlay-*")) == []


def owner_labels() -> dict[str, str]:
    return {OWNER_LABEL: Owner.current().label()}


def test_the_process_gets_the_configs_user_environment_and_directory_and_the_callers_additions(image, client):
    request = ContainerRequest(
        ("cat /tmp/put.txt; echo written > out.txt; echo uid=$(id -u) gid=$(id -g) home=$HOME cwd=$(pwd) "
         "$GREETING $SHADOWED $EXTRA; echo to-stderr >&2; exit 3",),
        environment={"EXTRA": "caller", "SHADOWED": "caller"}, labels=owner_labels())
    with image.container(client, request) as container:
        # The owner label is where the sweep and the reaper look for a dead run's containers.
        assert [found.id for found in client.containers.list(all=True, filters={"label": OWNER_LABEL})] == \
            [container.id]
        container.put_archive("/tmp", _tar(lambda archive: _add_text(archive, "put.txt", "put before the start\n")))
        container.start()
        assert exit_status(container, poll_s=0.05) == 3
        assert container.logs(stdout=True, stderr=False).decode() == (
            f"put before the start\nuid={USER_ID} gid={USER_ID} home=/home/app cwd=/home/app from-image caller "
            "caller\n")
        assert container.logs(stdout=False, stderr=True).decode() == "to-stderr\n"
        chunks, _ = container.get_archive("/home/app/out.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
            assert archive.extractfile("out.txt").read() == b"written\n"
        with pytest.raises(docker.errors.NotFound):
            container.get_archive("/home/app/absent")


def test_the_images_command_runs_when_the_caller_names_none(image, client):
    with image.container(client, ContainerRequest(())) as container:
        container.start()
        assert exit_status(container, poll_s=0.05) == 0
        assert container.logs() == b"default-cmd\n"


def test_the_settings_are_what_a_container_of_the_stored_image_gets(podman, image, write_once_root, client):
    """The same probe in a container of the image imported into podman's storage and in one on the
    assembled root: the same user, groups, directory, environment and limits."""
    _, storage = podman
    subprocess.run(["podman", *podman_service.storage_args(storage), "pull", "--quiet",
                    f"oci:{write_once_root / 'layout'}:tiny"], check=True, capture_output=True)
    request = ContainerRequest(("id; pwd; ulimit -n; env",), environment={"EXTRA": "caller"})
    seen = []
    try:
        for source in (StoredImage(image.name), image):
            with source.container(client, request) as container:
                container.start()
                assert exit_status(container, poll_s=0.05) == 0
                lines = container.logs().decode().splitlines()
                seen.append(sorted(line for line in lines if not line.startswith("HOSTNAME=")))
    finally:
        client.images.remove(image.name, force=True)
    assert seen[0] == seen[1]
    assert "EXTRA=caller" in seen[1] and "container=podman" in seen[1]


def test_a_callers_entrypoint_drops_the_images_command_as_docker_does(tmp_path):
    config = {"config": SETTINGS}
    own = rootfs_container.spec(tmp_path, config, ContainerRequest(("-x",), ("/bin/true",)))
    assert (own["entrypoint"], own["command"]) == (["/bin/true"], ["-x"])
    assert own["user"] == "app" and own["work_dir"] == "/home/app" and own["netns"] == {"nsmode": "none"}
    assert own["env"] == {"container": "podman", "PATH": "/usr/bin:/bin", "GREETING": "from-image",
                          "SHADOWED": "image"}
    images = rootfs_container.spec(tmp_path, config, ContainerRequest(()))
    assert (images["entrypoint"], images["command"]) == (["/bin/sh", "-c"], ["echo default-cmd"])
    bare = rootfs_container.spec(tmp_path, {"config": {}}, ContainerRequest(("/bin/true",), network_disabled=False))
    assert "user" not in bare and "work_dir" not in bare and "netns" not in bare


def test_the_smoke_gate_runs_a_traced_check_on_the_assembled_root(image, client):
    run = smoke_gate.run_traced(image, "patches", client, owner_labels())
    assert run.stack == "tiny"
    assert run.results == [smoke_report.passed("patches.none", f"{USER_ID} /home/app {read_tracer.LIBRARY}:/opt")]
    assert run.traces == ["traced -m builder.runtime.smoke --json --only patches\n"]
    report = smoke_gate.run_in_image(image, client=client, labels=owner_labels())
    assert report.image == image.name and report.passed


def test_the_sboms_inventory_is_taken_on_the_assembled_root(image, client):
    inventory = sbom.take_inventory(image, client, labels=owner_labels())
    assert inventory.installed == [("packaging", "24.0", None)]
    assert [component.purl.to_string() for component in inventory.system] == [
        "pkg:deb/debian/base-files@12.4?arch=amd64&distro=debian-12"]


def test_a_failed_run_leaves_nothing(image, client):
    with pytest.raises(BuildFailure, match=rf"^{image.name}: cannot run /no/python in it: .*/no/python"):
        sbom.installed_distributions(image, client, python="/no/python", labels=owner_labels())
    with pytest.raises(RuntimeError, match="the caller failed"):
        with image.container(client, ContainerRequest(("sleep 60",), labels=owner_labels())) as container:
            container.start()
            raise RuntimeError("the caller failed")
    with pytest.raises(UserError, match="GPUs are passed to an image in the Docker daemon or the engine's"):
        smoke_gate.run_in_image(image, gpus="all", client=client)


def test_an_image_the_layout_does_not_hold_whole_takes_the_old_path(write_once_root, tmp_path, image_id):
    assert rootfs_container.layout_image(write_once_root, "sha256:" + "0" * 64) is None
    layout = Layout.create(tmp_path / "layout")
    for blob in [image_id, *json.loads(Layout(write_once_root / "layout").read_blob(image_id))["rootfs"]["diff_ids"]]:
        shutil.copy(Layout(write_once_root / "layout").blob_path(blob), layout.blob_path(blob))
    assert rootfs_container.layout_image(tmp_path, image_id) is not None
    layout.remove_blob(json.loads(layout.read_blob(image_id))["rootfs"]["diff_ids"][-1])
    assert rootfs_container.layout_image(tmp_path, image_id) is None


# A run that stacks the image's layers for a container and is killed there (its stdout: the stack's place).
KILLED_RUN = """
import json, sys, time
from pathlib import Path
from builder.engine import overlay_mount
from builder.oci.layer_index import LayerIndex
lowers = [LayerIndex(diff_id, Path(index), Path(blob), root) for diff_id, index, blob, root in json.loads(sys.argv[2])]
with overlay_mount.stacked(lowers, Path(sys.argv[1])) as stack:
    print(stack.merged.parent, flush=True)
    time.sleep(600)
"""


def test_what_a_killed_run_left_is_swept_once_no_live_run_stacks_there(image, write_once_root, image_id):
    lowers = json.dumps([(lower.diff_id, str(lower.index), str(lower.blob), lower.lists_root) for lower in image.lowers])
    killed = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(image.scratch), lowers],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    left = Path(killed.stdout.readline().strip())
    killed.kill()
    killed.wait()
    killed.stdout.close()
    assert _mounts_under(left) != []
    with overlay_mount.stacked(image.lowers, image.scratch) as live:
        # A live stack cannot be told from a dead one: the sweep waits for a moment with none.
        assert rootfs_container.layout_image(write_once_root, image_id) is not None
        assert _mounts_under(left) != [] and _mounts_under(live.merged.parent) != []
    assert rootfs_container.layout_image(write_once_root, image_id) is not None
    assert not left.exists() and _mounts_under(image.scratch) == []
