"""The wheel layer writer (builder/oci/wheel_layer.py) against pip itself: the files a layer holds are
what `pip install --no-deps --no-compile` puts into a fresh venv of the same Python; the tar is
canonical and the same bytes twice; the image's own tool (builder/runtime/install_wheels.py) lays the
same plan out as the same files; a blob write that dies leaves no blob; a wheel that is not the lock's,
and a plan that is not one, are refused. The OCI layout it writes into (builder/oci/layout.py) is tested here too."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from builder.errors import BuildFailure
from builder.files import sha256_file
from builder.oci.layout import Layout, LayoutError, digest_of
from builder.oci.wheel_layer import (INSTALLER_NAME, LockedWheel, VenvScheme, WheelPlan, plan_layer,
                                     write_planned_layer, write_wheel_layer)

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
    layer = {path.removeprefix(prefix): value for path, value in _layer_files(layout, written.diff_id).items()
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
    with layout.open_blob(written.diff_id) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        ours = {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith(".dist-info/RECORD")}
    for path in records:
        assert _without_installer_lines(ours[prefix + path]) == \
            _without_installer_lines((image_root / path).read_bytes()), path
    assert sum(kind == "file" for _, kind, _ in written.listing) == \
        sum(1 for value in layer.values() if value[0] == tarfile.REGTYPE)
    assert (venv / "bin" / "wheel").read_bytes().startswith(f"#!{venv}/bin/python\n".encode())
    assert (venv / "bin" / "jsonpointer").read_bytes().startswith(f"#!{venv}/bin/python\n".encode())


@pytest.mark.network
def test_the_layer_is_canonical_and_reproducible(wheels, tmp_path):
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    first = write_wheel_layer(Layout.create(tmp_path / "one"), _locked(wheels), scheme, EPOCH)
    second = write_wheel_layer(Layout.create(tmp_path / "two"), _locked(list(reversed(wheels))), scheme, EPOCH)
    assert first == second
    one = (tmp_path / "one" / "blobs" / "sha256" / first.diff_id.removeprefix("sha256:")).read_bytes()
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
def test_two_wheels_that_write_one_path_are_refused_unless_it_is_the_same_file(wheels, tmp_path):
    """The CUDA 12 wheels each carry the same empty nvidia/__init__.py: one file in the layer. A path two
    wheels write with different bytes is refused (pip's install order would decide it)."""
    six = next(path for path in wheels if path.name.startswith("six-"))
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")

    def wheel_with(directory: str, shared: bytes) -> Path:
        return _made_wheel(tmp_path, directory, {"nvidia/__init__.py": shared, f"nvidia/{directory}/x.py": b"x = 1\n"})

    one, two, other = wheel_with("one", b""), wheel_with("two", b""), wheel_with("other", b"# not empty\n")
    plan = plan_layer(_locked([one, two]), scheme)
    shared = [f for f in plan.files if f.path.endswith("site-packages/nvidia/__init__.py")]
    assert len(shared) == 1 and shared[0].size == 0
    assert sum(f.path.endswith("/x.py") for f in plan.files) == 2
    with pytest.raises(BuildFailure, match=r"^opt/venv/lib/python3.11/site-packages/nvidia/__init__.py: in both "
                                           r"one-1.0-py3-none-any.whl and other-1.0-py3-none-any.whl, with different "
                                           r"content$"):
        plan_layer(_locked([one, other]), scheme)
    copy = tmp_path / "copy" / six.name
    copy.parent.mkdir()
    copy.write_bytes(six.read_bytes())
    assert plan_layer(_locked([six, copy]), scheme).files == plan_layer(_locked([six]), scheme).files


def _record_value(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _made_wheel(root: Path, distribution: str, files: dict[str, bytes], recorded: dict[str, str] | None = None) -> Path:
    """A wheel of `files` under `root`/`distribution`; RECORD gives each file's true hash unless `recorded`
    says what to write instead ("" for none)."""
    import zipfile

    path = root / distribution / f"{distribution}-1.0-py3-none-any.whl"
    path.parent.mkdir()
    dist_info = f"{distribution}-1.0.dist-info"
    files = {**files, f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n".encode(),
             f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    hashes = {name: _record_value(data) for name, data in files.items()} | (recorded or {})
    record = "".join(f"{n},{hashes[n]},{len(d)}\n" for n, d in files.items()) + f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in {**files, f"{dist_info}/RECORD": record.encode()}.items():
            archive.writestr(member, data)
    return path


def test_a_file_is_planned_on_records_word_and_checked_as_it_is_written(tmp_path):
    """The plan takes a member's hash from the wheel's RECORD without decompressing it; writing the layer
    hashes it as it streams, so a RECORD that lies fails the layer and stores no blob. A member RECORD
    gives no hash for is hashed while planning, and the layer's RECORD has its true hash either way."""
    scheme = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")
    honest = _made_wheel(tmp_path, "honest", {"honest/a.py": b"a = 1\n", "honest/b.py": b"b = 2\n"},
                         {"honest/b.py": ""})
    plan = plan_layer(_locked([honest]), scheme)
    by_name = {f.path.rsplit("site-packages/", 1)[-1]: f for f in plan.files}
    assert by_name["honest/a.py"].sha256 == hashlib.sha256(b"a = 1\n").hexdigest()
    assert by_name["honest/b.py"].sha256 is None and by_name["honest/b.py"].member == "honest/b.py"
    record = by_name["honest-1.0.dist-info/RECORD"].data.decode()
    assert f"honest/b.py,{_record_value(b'b = 2' + bytes([10]))},6" in record
    assert WheelPlan.from_json(plan.to_json(), "plan") == plan
    layout = Layout.create(tmp_path / "layout")
    write_planned_layer(layout, plan, honest.parent, EPOCH)
    liar = _made_wheel(tmp_path, "liar", {"liar/a.py": b"a = 1\n"}, {"liar/a.py": _record_value(b"a = 2\n")})
    lying = plan_layer(_locked([liar]), scheme)
    before = sorted(layout.blobs.iterdir())
    with pytest.raises(BuildFailure, match=r"^liar-1.0-py3-none-any.whl: liar/a.py has sha256 [0-9a-f]{64}, its "
                                           r"RECORD says [0-9a-f]{64}; not installed$"):
        write_planned_layer(layout, lying, liar.parent, EPOCH)
    assert sorted(layout.blobs.iterdir()) == before


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


REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "builder" / "runtime" / "install_wheels.py"
SCHEME = VenvScheme("/opt/venv", "3.11", "/opt/venv/bin/python")


@pytest.mark.network
def test_the_images_tool_lays_out_the_plan_as_the_layers_files(wheels, tmp_path):
    """One plan, two writers: the files install_wheels.py writes (as the plain engine build runs it) are
    the layer's, path for path, with the same type, mode, size and content."""
    plan = plan_layer(_locked(wheels), SCHEME)
    assert WheelPlan.from_json(plan.to_json(), "plan") == plan
    (tmp_path / "plan.json").write_bytes(plan.to_json())
    root = tmp_path / "root"
    umask = os.umask(0o022)  # what a build's RUN step has
    try:
        subprocess.run([sys.executable, "-I", "-B", str(TOOL), "install", str(tmp_path / "plan.json"),
                        str(wheels[0].parent), str(root)], check=True)
    finally:
        os.umask(umask)
    layout = Layout.create(tmp_path / "layout")
    written = write_planned_layer(layout, plan, wheels[0].parent, EPOCH)
    assert _tree_files(root, root) == _layer_files(layout, written.diff_id)
    assert [row for row in written.listing if row[1] == "file"] == \
        [("/" + planned.path, "file", "") for planned in plan.files]


@pytest.mark.network
def test_directories_the_engine_leaves_are_in_the_layer_in_order(wheels, tmp_path):
    plan = plan_layer(_locked(wheels[:1]), SCHEME)
    layout = Layout.create(tmp_path / "layout")
    written = write_planned_layer(layout, plan, wheels[0].parent, EPOCH, directories=("run",))
    with layout.open_blob(written.diff_id) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        names = [(m.name, m.type, m.mode) for m in tar]
    assert names[-1] == ("run", tarfile.DIRTYPE, 0o755) and names[0][0] == "opt"
    assert [row[0] for row in written.listing] == ["/" + name for name, _, _ in names]


@pytest.mark.network
def test_a_layer_stopped_from_another_thread_leaves_no_blob(wheels, tmp_path):
    plan = plan_layer(_locked(wheels[:1]), SCHEME)
    layout = Layout.create(tmp_path / "layout")
    stop = threading.Event()
    stop.set()
    with pytest.raises(BuildFailure, match="stopped"):
        write_planned_layer(layout, plan, wheels[0].parent, EPOCH, stop=stop)
    assert list(layout.blobs.iterdir()) == []
    written = write_planned_layer(layout, plan, wheels[0].parent, EPOCH, stop=threading.Event())
    assert [path.name for path in layout.blobs.iterdir()] == [written.diff_id.removeprefix("sha256:")]


def test_the_images_tool_refuses_a_wheel_that_is_not_the_plans(wheels, tmp_path):
    plan = plan_layer(_locked(wheels[:1]), SCHEME)
    (tmp_path / "plan.json").write_bytes(plan.to_json())
    other = tmp_path / "wheels"
    other.mkdir()
    (other / wheels[0].name).write_bytes(wheels[0].read_bytes() + b"tail")
    done = subprocess.run([sys.executable, "-I", "-B", str(TOOL), "install", str(tmp_path / "plan.json"), str(other),
                           str(tmp_path / "root")], capture_output=True, text=True)
    assert done.returncode == 1 and not (tmp_path / "root").exists()
    assert done.stderr == f"install_wheels: {wheels[0].name}: not the locked file (sha256 differs from the plan's)\n"
    with pytest.raises(BuildFailure, match=rf"^{wheels[0].name}: sha256 [0-9a-f]{{64}}, the lock says"):
        write_planned_layer(Layout.create(tmp_path / "layout"), plan, other, EPOCH)


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(format=2), "format 2"),
    (lambda d: d["files"][0].update(path="../etc/passwd"), "bad entry '../etc/passwd'"),
    (lambda d: d["files"][0].update(path="/etc/passwd"), "bad entry '/etc/passwd'"),
    (lambda d: d["files"][0].update(mode=0o4755), "bad entry"),
    (lambda d: d["files"][0].update(wheel=5), "bad entry"),
    (lambda d: d["files"][0].pop("member"), "'member'"),
])
def test_a_plan_that_is_not_one_is_refused_by_both_writers(tmp_path, change, problem):
    import json

    document = {"format": 1, "wheels": [{"file": "a-1-py3-none-any.whl", "sha256": "0" * 64}],
                "files": [{"path": "opt/venv/a.py", "mode": 0o644, "size": 1, "wheel": 0, "member": "a.py"}]}
    change(document)
    data = json.dumps(document).encode()
    with pytest.raises(BuildFailure, match=rf"^plan\.json: not a wheel plan: .*{problem}"):
        WheelPlan.from_json(data, "plan.json")
    if "member" not in problem:
        (tmp_path / "plan.json").write_bytes(data)  # refused before any wheel is read: there is none
        done = subprocess.run([sys.executable, "-I", "-B", str(TOOL), "install", str(tmp_path / "plan.json"),
                               str(tmp_path), str(tmp_path / "root")], capture_output=True, text=True)
        assert done.returncode == 1 and done.stderr.startswith("install_wheels: ") and \
            len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.network
def test_each_groups_plan_is_made_once_and_kept_by_what_it_is_made_from(wheels, tmp_path, monkeypatch):
    """build_stack/wheel_plans.py: a second build links the kept plans and reads no wheel to plan them."""
    from types import SimpleNamespace

    from builder.build_stack import wheel_plans
    from builder.cache.wheel_cache import LockedWheel as CachedWheel, WheelCache

    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    cache = WheelCache(tmp_path / "cache" / "locked-wheels")
    distributions = []
    for path, group in zip(wheels, ("torch", "kernels", "sglang", "sglang")):
        name, version = path.name.split("-")[:2]
        distributions.append(SimpleNamespace(name=name, version=version, wheel=path.name, sha256=sha256_file(path),
                                             source="default", url=None, group=group))
        target = cache.path(CachedWheel(name, version, path.name, sha256_file(path), "default"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    resolution = SimpleNamespace(python="3.11", distributions=tuple(distributions))
    planned = []
    real = wheel_plans.plan_layer
    monkeypatch.setattr(wheel_plans, "plan_layer", lambda *args: planned.append(args) or real(*args))
    for context in ("one", "two"):
        (tmp_path / context).mkdir()
        wheel_plans.stage_plans(resolution, cache, tmp_path / context)
    assert len(planned) == 3  # one per group, in the first build only
    for group in ("torch", "kernels", "sglang"):
        one, two = (tmp_path / "one" / f"{group}.plan.json"), (tmp_path / "two" / f"{group}.plan.json")
        assert one.read_bytes() == two.read_bytes() and one.stat().st_ino == two.stat().st_ino
    sglang = WheelPlan.from_json((tmp_path / "one" / "sglang.plan.json").read_bytes(), "plan")
    assert [name for name, _ in sglang.wheels] == sorted(path.name for path in wheels[2:])


def _compiled(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*.pyc"))}


def test_the_images_tool_compiles_what_compileall_compiles_and_the_same_bytes_every_time(tmp_path):
    """`install_wheels.py compile` deals the modules to a fixed number of interpreters: the .pyc files are
    those compileall.compile_dir writes, with a module that does not compile skipped and a linked
    directory not entered, and a second run writes the same bytes."""
    site = tmp_path / "site"
    for index in range(11):
        package = site / f"pkg{index % 3}" / f"sub{index}"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"VALUE = {{'a': {index}, 'b': frozenset({{'x', 'y'}})}}\n")
        (package / f"mod{index}.py").write_text(f"def f(self):\n    return self.{'name'} * {index}\n")
    (site / "broken.py").write_text("def (\n")
    (site / "notes.txt").write_text("not a module\n")
    (site / "linked").symlink_to(site / "pkg0")
    env = {**os.environ, "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": str(EPOCH)}

    def run_tool() -> dict[str, bytes]:
        done = subprocess.run([sys.executable, "-B", str(TOOL), "compile", str(site)], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        compiled = _compiled(site)
        for cache in site.rglob("__pycache__"):
            shutil.rmtree(cache)
        return compiled

    first, second = run_tool(), run_tool()
    subprocess.run([sys.executable, "-B", "-c", "import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2)",
                    str(site)], env=env, check=True)
    assert first == second
    assert set(first) == set(_compiled(site)) and len(first) == 22
    assert not any(name.startswith(("linked", "broken")) for name in first)
