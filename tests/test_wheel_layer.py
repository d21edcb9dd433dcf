"""The wheel layer writer (builder/oci/wheel_layer.py) against pip itself: the files a layer holds are
what `pip install --no-deps --no-compile` puts into a fresh venv of the same Python; the tar is
canonical and the same bytes twice; a blob write that dies leaves no blob; a wheel that is not the
lock's is refused. The OCI layout it writes into (builder/oci/layout.py) is tested here too."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from builder.errors import BuildFailure
from builder.files import sha256_file
from builder.oci.layout import Layout, LayoutError, digest_of
from builder.oci.wheel_layer import INSTALLER_NAME, LockedWheel, VenvScheme, write_wheel_layer

EPOCH = 1_700_000_000
# Small real wheels: plain modules, a package, console scripts (wheel), a .data/scripts file with a
# `#!python` shebang (jsonpointer 2.4).
PINS = ("six==1.16.0", "idna==3.10", "wheel==0.45.1", "jsonpointer==2.4")


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> list[Path]:
    """Downloaded once per session from pip's default index (or the cache a CI run keeps)."""
    cache = Path(os.environ.get("BUILDER_TEST_WHEELS") or tmp_path_factory.mktemp("wheels"))
    names = sorted(cache.glob("*.whl"))
    if len(names) < len(PINS):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", str(cache), *PINS], check=True)
        names = sorted(cache.glob("*.whl"))
    return names


def _locked(paths: list[Path]) -> list[LockedWheel]:
    return [LockedWheel(path, sha256_file(path)) for path in paths]


def _layer_files(layout: Layout, digest: str) -> dict[str, tuple]:
    """path -> (type, mode, size, sha256) for every entry of the layer's tar."""
    files = {}
    with layout.open_blob(digest, verify=True) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            content = hashlib.sha256(tar.extractfile(member).read()).hexdigest() if member.isreg() else ""
            files[member.name] = (member.type, member.mode, member.size, content)
    return files


def _tree_files(root: Path, under: Path) -> dict[str, tuple]:
    """The same view of what pip wrote under `root`, named as the layer names it (relative to /)."""
    files = {}
    for directory, subdirectories, names in os.walk(root):
        for name in subdirectories + names:
            path = Path(directory) / name
            info = path.lstat()
            key = "/".join(path.relative_to(under).parts)
            if stat.S_ISLNK(info.st_mode):
                files[key] = (tarfile.SYMTYPE, 0, 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                files[key] = (tarfile.DIRTYPE, stat.S_IMODE(info.st_mode), 0, "")
            else:
                files[key] = (tarfile.REGTYPE, stat.S_IMODE(info.st_mode), info.st_size,
                              hashlib.sha256(path.read_bytes()).hexdigest())
    return files


def _without_installer_lines(record: bytes) -> bytes:
    return b"".join(line for line in record.splitlines(keepends=True) if b".dist-info/INSTALLER," not in line)


@pytest.mark.network
def test_the_layer_holds_what_pip_installs(wheels, tmp_path):
    image_root = tmp_path / "r"  # the venv lives at <image_root>/venv, as it would at /venv in an image
    venv = image_root / "venv"
    umask = os.umask(0o022)  # what a build's RUN step has
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        before = _tree_files(venv, image_root)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                        "--no-deps", "--no-compile", "--no-index", "--find-links", str(wheels[0].parent), *PINS],
                       check=True, env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    finally:
        os.umask(umask)
    after = _tree_files(venv, image_root)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    scheme = VenvScheme(str(venv), version, str(venv / "bin" / "python"))
    layout = Layout.create(tmp_path / "layout")
    written = write_wheel_layer(layout, _locked(wheels), scheme, EPOCH)

    # The layer's paths are relative to the image's root; here that root is `image_root`.
    prefix = str(image_root).lstrip("/") + "/"
    layer = {path.removeprefix(prefix): value for path, value in _layer_files(layout, written.digest).items()
             if path.startswith(prefix + "venv/")}
    pip_added = {path: value for path, value in after.items() if path not in before}
    layer_added = {path: value for path, value in layer.items() if path not in before}
    assert layer_added.keys() == pip_added.keys()
    # What else the layer holds are the venv's own directories, as the venv has them.
    assert {path: layer[path] for path in layer.keys() - layer_added.keys()} == \
        {path: before[path] for path in layer.keys() - layer_added.keys()}
    installers = [path for path in pip_added if path.endswith(".dist-info/INSTALLER")]
    records = [path for path in pip_added if path.endswith(".dist-info/RECORD")]
    assert len(installers) == len(records) == len(PINS)
    for path in sorted(pip_added):
        if path in installers:
            assert (image_root / path).read_bytes() == b"pip\n"
            assert layer_added[path][2] == len(INSTALLER_NAME)
        elif path not in records:
            assert layer_added[path] == pip_added[path], path
    with layout.open_blob(written.digest) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        ours = {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith(".dist-info/RECORD")}
    for path in records:
        assert _without_installer_lines(ours[prefix + path]) == \
            _without_installer_lines((image_root / path).read_bytes()), path
    assert written.files == sum(1 for value in layer.values() if value[0] == tarfile.REGTYPE)
    assert (venv / "bin" / "wheel").read_bytes().startswith(f"#!{venv}/bin/python\n".encode())
    assert (venv / "bin" / "jsonpointer").read_bytes().startswith(f"#!{venv}/bin/python\n".encode())


@pytest.mark.network
def test_the_layer_is_canonical_and_reproducible(wheels, tmp_path):
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    first = write_wheel_layer(Layout.create(tmp_path / "one"), _locked(wheels), scheme, EPOCH)
    second = write_wheel_layer(Layout.create(tmp_path / "two"), _locked(list(reversed(wheels))), scheme, EPOCH)
    assert first == second
    one = (tmp_path / "one" / "blobs" / "sha256" / first.digest.removeprefix("sha256:")).read_bytes()
    assert digest_of(one) == first.diff_id and len(one) == first.size
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names, key=lambda name: name.split("/"))
    assert names[:3] == ["opt", "opt/venv", "opt/venv/bin"]
    assert {m.mtime for m in members} == {EPOCH}
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
    assert {m.mode for m in members if m.isdir()} == {0o755}
    assert {m.mode for m in members if m.isreg()} == {0o644, 0o755}
    assert "opt/venv/bin/wheel" in names and "opt/venv/bin/jsonpointer" in names
    assert not any(m.pax_headers for m in members)  # plain ustar where ustar holds it


@pytest.mark.network
def test_a_wheel_that_is_not_the_locks_is_refused(wheels, tmp_path):
    layout = Layout.create(tmp_path / "layout")
    locked = _locked(wheels)
    locked[1] = LockedWheel(locked[1].path, "0" * 64)
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    with pytest.raises(BuildFailure, match=rf"^{wheels[1].name}: sha256 [0-9a-f]{{64}}, the lock says 0{{64}}; "
                                           "not installed$"):
        write_wheel_layer(layout, locked, scheme, EPOCH)
    assert list(layout.blobs.iterdir()) == []


def test_a_blob_whose_bytes_are_not_its_digest_is_not_stored(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    expected = digest_of(b"the right bytes")
    with pytest.raises(LayoutError, match="hashes to"):
        layout.write_blob(b"other bytes", expected=expected)
    assert list(layout.blobs.iterdir()) == []
    assert layout.write_blob(b"the right bytes", expected=expected).digest == expected
    assert layout.read_blob(expected) == b"the right bytes"


def test_an_error_mid_stream_leaves_no_blob(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    with pytest.raises(RuntimeError):
        with layout.blob_writer() as writer:
            writer.write(b"half a layer")
            raise RuntimeError("the source failed")
    assert list(layout.blobs.iterdir()) == []


def test_a_write_killed_midway_leaves_no_blob_under_a_digest(tmp_path):
    """SIGKILL while a blob streams in: at most a temporary file, never a file named by a digest."""
    layout = Layout.create(tmp_path / "layout")
    program = textwrap.dedent(f"""
        import sys, time
        from builder.oci.layout import Layout
        layout = Layout({str(layout.root)!r})
        with layout.blob_writer() as writer:
            writer.write(b"x" * (1 << 20))
            sys.stdout.write("started\\n"); sys.stdout.flush()
            while True:
                writer.write(b"y" * 4096)
                time.sleep(0.01)
    """)
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert child.stdout.readline() == "started\n"
    time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = [path.name for path in layout.blobs.iterdir()]
    assert left and all(name.startswith(".") and name.endswith(".tmp") for name in left)


def test_reading_a_damaged_blob_fails_its_digest(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    digest = layout.write_blob(b"layer bytes" * 1000).digest
    layout.blob_path(digest).write_bytes(b"damaged")
    with pytest.raises(LayoutError, match=f"blob {digest} reads as"):
        layout.read_blob(digest)
    with pytest.raises(LayoutError, match=f"blob {digest} reads as"), layout.open_blob(digest, verify=True) as stream:
        while stream.read(4):
            pass


def test_an_image_is_written_with_deterministic_json(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    layer = layout.write_blob(b"a layer")
    manifest = layout.write_image(b'{"rootfs":{}}', [layer.as_json("application/vnd.oci.image.layer.v1.tar")], "x")
    assert layout.manifest("x")["layers"][0]["digest"] == layer.digest
    assert layout.manifest_descriptor()["digest"] == manifest.digest
    assert (layout.root / "index.json").read_bytes() == (
        b'{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"x"},"digest":"' + manifest.digest.encode()
        + b'","mediaType":"application/vnd.oci.image.manifest.v1+json","size":' + str(manifest.size).encode()
        + b'}],"schemaVersion":2}')
    with pytest.raises(LayoutError, match="holds 0 images named y, not one"):
        layout.manifest("y")


@pytest.mark.network
def test_two_wheels_that_write_one_path_are_refused(wheels, tmp_path):
    layout = Layout.create(tmp_path / "layout")
    six = next(path for path in wheels if path.name.startswith("six-"))
    copy = tmp_path / "copy" / six.name
    copy.parent.mkdir()
    copy.write_bytes(six.read_bytes())
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    with pytest.raises(BuildFailure, match=rf"^opt/venv/lib/python3.11/site-packages/\S+: in both {six.name} and "
                                           rf"{six.name}$"):
        write_wheel_layer(layout, _locked([six, copy]), scheme, EPOCH)
    assert list(layout.blobs.iterdir()) == []


def test_comparing_a_layout_whose_config_is_damaged_says_so(tmp_path):
    """layer_diff reads layouts through layout.py now: a config blob that is not its digest is named,
    where it used to be read as the image (and its hash reported as the image's id)."""
    from builder.errors import UserError
    from builder.oci.layer_diff import read_image

    layout = Layout.create(tmp_path / "layout")
    layer = layout.write_blob(b"")
    config = b'{"rootfs":{"diff_ids":["' + layer.digest.encode() + b'"]}}'
    layout.write_image(config, [layer.as_json("application/vnd.oci.image.layer.v1.tar")])
    assert read_image(layout.root).config_digest == digest_of(config)
    layout.blob_path(digest_of(config)).write_bytes(config.replace(b"rootfs", b"rootfz"))
    with pytest.raises(UserError, match=f"blob {digest_of(config)} reads as sha256:"):
        read_image(layout.root)
