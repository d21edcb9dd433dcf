"""Layer indexes (builder/oci/layer_index.py) and their overlay stacks (builder/engine/overlay_mount.py):
layers made by hand, indexed, mounted, stacked and read back, each held to what GNU tar extracts. Needs
root (mount, trusted.* xattrs) and mkfs.erofs (scripts/erofs-utils)."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import contextlib
import shutil
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.engine import overlay_mount
from builder.engine.overlay_mount import stacked
from builder.errors import BuildFailure, UserError
from builder.files import mounts_below
from builder.oci import layer_index, tree_layer
from builder.oci.layer_index import LayerIndex, LayerIndexes
from builder.oci.layout import Layout, hex_of

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes device nodes and mounts overlayfs: root only")

EPOCH = 1767225600


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, uid: int = 0,
           gid: int = 0, mtime: int = EPOCH, link: str = "", xattrs: dict[str, str] | None = None):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.mtime, info.linkname = kind, mode, uid, gid, mtime, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.pax_headers = {f"SCHILY.xattr.{key}": value for key, value in (xattrs or {}).items()}
    return info, data


def directory(name: str, mode: int = 0o755, **fields):
    return member(name.rstrip("/") + "/", tarfile.DIRTYPE, mode=mode, **fields)


def whiteout(path: str):
    parent, _, name = path.rpartition("/")
    return member(f"{parent}/.wh.{name}" if parent else f".wh.{name}", mode=0)


def layer_bytes(*members) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return buffer.getvalue()


def add_layer(layout: Layout, *members) -> str:
    return layout.write_blob(layer_bytes(*members)).digest


def describe(root: Path) -> dict[str, tuple]:
    """Every path under `root` (not root itself): type, permission bits, owner, mtime, and content or target."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        owner = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
        if stat.S_ISLNK(info.st_mode):
            found[str(path.relative_to(root))] = ("link", os.readlink(path), info.st_uid, info.st_gid)
        elif stat.S_ISDIR(info.st_mode):
            found[str(path.relative_to(root))] = ("dir", *owner, info.st_mtime_ns)
        elif stat.S_ISREG(info.st_mode):
            found[str(path.relative_to(root))] = ("file", *owner, info.st_mtime_ns, path.read_bytes())
        else:
            found[str(path.relative_to(root))] = ("other", stat.S_IFMT(info.st_mode), info.st_rdev)
    return found


def seconds(value: int) -> int:
    return value * 1_000_000_000


@pytest.fixture(autouse=True)
def no_mounts_left(tmp_path):
    yield
    left = mounts_below(tmp_path)
    for point in left:
        subprocess.run(["umount", "--lazy", str(point)], check=False)
    assert not left, f"mounts left behind: {left}"


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout.create(tmp_path / "layout")


@pytest.fixture
def indexes(tmp_path) -> LayerIndexes:
    return LayerIndexes(tmp_path / "indexes")


@contextlib.contextmanager
def mounted(lower: LayerIndex, place: Path) -> Iterator[Path]:
    """One layer alone, as overlayfs sees it as a lower directory."""
    place.mkdir(parents=True, exist_ok=True)
    target = place / "layer"
    overlay_mount._mount_layer(lower, target)
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)
        target.rmdir()


def extracted(layout: Layout, diff_id: str, target: Path) -> Path:
    """What GNU tar extracts of the layer, whiteouts left as they are: the reference for the index."""
    target.mkdir()
    subprocess.run(["tar", "--extract", "--numeric-owner", "--same-owner", "--same-permissions", "--xattrs",
                    "--xattrs-include=*", "--delay-directory-restore", "--exclude=.wh.*",
                    "--file", str(layout.blob_path(diff_id)), "--directory", str(target)], check=True)
    return target


T1, T2, T3 = EPOCH - 300, EPOCH - 200, EPOCH - 100


def three_layers(layout: Layout) -> list[str]:
    base = add_layer(
        layout,
        directory(".", mtime=T1),
        directory("bin", mtime=T1),
        member("bin/sh", data=b"#!shell", mode=0o755, mtime=T1),
        member("bin/rsh", tarfile.LNKTYPE, link="bin/sh", mtime=T1),
        member("bin/shell", tarfile.SYMTYPE, link="sh", mtime=T1),
        member("bin/su", data=b"su", mode=0o4755, mtime=T1),
        member("bin/wall", data=b"wall", mode=0o2755, gid=5, mtime=T1),
        directory("etc", mtime=T1),
        member("etc/gone", data=b"old", mtime=T1),
        member("etc/passwd", data=b"root:x:0:0", mtime=T1),
        directory("home", mtime=T1),
        directory("home/user", mode=0o700, uid=1000, gid=1000, mtime=T1),
        member("home/user/notes", data=b"notes", mode=0o600, uid=1000, gid=1000, mtime=T1,
               xattrs={"user.note": "kept"}),
        directory("opt", mtime=T1),
        member("opt/old", data=b"old", mtime=T1),
        directory("opt/sub", mtime=T1),
        member("opt/sub/deep", data=b"deep", mtime=T1),
        directory("tmp", mode=0o1777, mtime=T1),
    )
    second = add_layer(
        layout,
        directory("etc", mtime=T2),
        whiteout("etc/gone"),
        member("etc/passwd", data=b"root:x:0:0\nuser:x:1000", mtime=T2),
        member("etc/x.wh.y", data=b"not a whiteout", mtime=T2),
        directory("opt", mode=0o750, mtime=T2),
        member("opt/.wh..wh..opq", mode=0),
        member("opt/new", data=b"new", mtime=T2),
    )
    third = add_layer(
        layout,
        directory("bin", mtime=T3),
        whiteout("bin/shell"),
        directory("usr", mtime=T3),
        directory("usr/local", mtime=T3),
        member("usr/local/tool", data=b"tool", mode=0o750, uid=123, gid=456, mtime=T3),
    )
    return [base, second, third]


def test_an_index_mounts_as_the_layer_overlayfs_reads_as_a_lower_directory(layout, indexes, tmp_path):
    _, second, _ = three_layers(layout)
    lower = indexes.index(layout, second)
    assert lower.index == indexes.root / f"{hex_of(second)}.erofs" and lower.blob == layout.blob_path(second)
    assert not lower.lists_root
    with mounted(lower, tmp_path / "view") as layer:
        assert describe(layer) == {
            "etc": ("dir", 0o755, 0, 0, seconds(T2)),
            "etc/gone": ("other", stat.S_IFCHR, os.makedev(0, 0)),
            "etc/passwd": ("file", 0o644, 0, 0, seconds(T2), b"root:x:0:0\nuser:x:1000"),
            "etc/x.wh.y": ("file", 0o644, 0, 0, seconds(T2), b"not a whiteout"),
            "opt": ("dir", 0o750, 0, 0, seconds(T2)),
            "opt/new": ("file", 0o644, 0, 0, seconds(T2), b"new"),
        }
        assert os.getxattr(layer / "opt", "trusted.overlay.opaque") == b"y"
        assert "trusted.overlay.opaque" not in os.listxattr(layer / "etc")
    # Only the headers are written: the data stays in the blob.
    assert lower.index.stat().st_size < layout.blob_path(second).stat().st_size


def test_an_index_holds_what_gnu_tar_extracts(layout, indexes, tmp_path):
    base = three_layers(layout)[0]
    lower = indexes.index(layout, base)
    assert lower.lists_root and lower.index.name == f"{hex_of(base)}.root.erofs"
    reference = extracted(layout, base, tmp_path / "tar")
    with mounted(lower, tmp_path / "view") as layer:
        assert describe(layer) == describe(reference)
        assert os.getxattr(layer / "home/user/notes", "user.note") == b"kept"
        assert (layer / "bin/rsh").stat().st_ino == (layer / "bin/sh").stat().st_ino
        assert layer.stat().st_mtime_ns == seconds(T1)  # the layer's "./" entry


def test_stacked_layers_show_the_image(layout, indexes, tmp_path):
    layers = three_layers(layout)
    lowers = [indexes.index(layout, diff_id) for diff_id in layers]
    blobs_before = [lower.blob.read_bytes() for lower in lowers]
    with stacked(lowers, tmp_path / "scratch") as stack:
        seen = describe(stack.merged)
        assert seen == {
            "bin": ("dir", 0o755, 0, 0, seconds(T3)),
            "bin/rsh": ("file", 0o755, 0, 0, seconds(T1), b"#!shell"),
            "bin/sh": ("file", 0o755, 0, 0, seconds(T1), b"#!shell"),
            "bin/su": ("file", 0o4755, 0, 0, seconds(T1), b"su"),
            "bin/wall": ("file", 0o2755, 0, 5, seconds(T1), b"wall"),
            "etc": ("dir", 0o755, 0, 0, seconds(T2)),
            "etc/passwd": ("file", 0o644, 0, 0, seconds(T2), b"root:x:0:0\nuser:x:1000"),
            "etc/x.wh.y": ("file", 0o644, 0, 0, seconds(T2), b"not a whiteout"),
            "home": ("dir", 0o755, 0, 0, seconds(T1)),
            "home/user": ("dir", 0o700, 1000, 1000, seconds(T1)),
            "home/user/notes": ("file", 0o600, 1000, 1000, seconds(T1), b"notes"),
            "opt": ("dir", 0o750, 0, 0, seconds(T2)),
            "opt/new": ("file", 0o644, 0, 0, seconds(T2), b"new"),
            "tmp": ("dir", 0o1777, 0, 0, seconds(T1)),
            "usr": ("dir", 0o755, 0, 0, seconds(T3)),
            "usr/local": ("dir", 0o755, 0, 0, seconds(T3)),
            "usr/local/tool": ("file", 0o750, 123, 456, seconds(T3), b"tool"),
        }
        merged = stack.merged
        assert (merged / "bin/rsh").stat().st_ino == (merged / "bin/sh").stat().st_ino
        assert (merged / "bin/sh").stat().st_nlink == 2
        assert os.getxattr(merged / "home/user/notes", "user.note") == b"kept"
        # The root as the base lists it (the layers above list none).
        assert (stat.S_IMODE(merged.stat().st_mode), merged.stat().st_uid) == (0o755, 0)
        # A directory keeps its inode number when a step copies it up: tree_layer tells kept from made again.
        etc = (merged / "etc").stat().st_ino
        # A step's changes land in the upper directory; the layers stay as they were.
        (merged / "etc/passwd").write_bytes(b"changed")
        (merged / "bin/sh").unlink()
        (merged / "opt/made").write_bytes(b"made")
        assert (merged / "etc").stat().st_ino == etc
        upper = describe(stack.upper)
        assert upper["etc/passwd"][-1] == b"changed" and upper["opt/made"][-1] == b"made"
        assert upper["bin/sh"] == ("other", stat.S_IFCHR, os.makedev(0, 0))
    assert [lower.blob.read_bytes() for lower in lowers] == blobs_before
    assert [path.name for path in (tmp_path / "scratch").iterdir()] == [".lock"]


def test_a_layer_without_a_root_entry_takes_the_root_below_it(layout, indexes, tmp_path):
    base = add_layer(layout, directory(".", mode=0o700, uid=7, gid=8), member("file", data=b"f"))
    above = add_layer(layout, member("other", data=b"o"))
    with stacked([indexes.index(layout, base), indexes.index(layout, above)], tmp_path / "scratch") as stack:
        info = stack.merged.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o700, 7, 8)
    with stacked([indexes.index(layout, above)], tmp_path / "scratch") as stack:
        info = stack.merged.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o755, 0, 0)


def test_overlayfs_attributes_set_by_a_layer_are_refused(layout, indexes):
    layer = add_layer(layout, directory("bin", xattrs={"trusted.overlay.opaque": "y"}), member("bin/sh"))
    with pytest.raises(BuildFailure) as failure:
        indexes.index(layout, layer)
    message = str(failure.value)
    assert layer in message and "trusted.overlay.opaque" in message and "\n" not in message
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock"]


def test_the_same_layer_is_indexed_once(layout, indexes):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"one"))
    first = indexes.index(layout, layer)
    identity = first.index.stat().st_ino
    assert indexes.index(layout, layer) == first
    assert first.index.stat().st_ino == identity
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock", first.index.name]


def test_two_indexings_at_once_both_end_with_the_index(layout, indexes, monkeypatch, tmp_path):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"x" * 100_000), whiteout("a/gone"))
    both_made = threading.Barrier(2, timeout=60)
    publish = layer_index._publish

    def publish_together(temporary, final):
        both_made.wait()
        publish(temporary, final)

    monkeypatch.setattr(layer_index, "_publish", publish_together)
    results: list[LayerIndex | BaseException] = []

    def index():
        try:
            results.append(indexes.index(layout, layer))
        except BaseException as error:  # handed to the test's thread
            results.append(error)

    threads = [threading.Thread(target=index) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1] and isinstance(results[0], LayerIndex)
    with mounted(results[0], tmp_path / "view") as view:
        assert set(describe(view)) == {"a", "a/file", "a/gone"}
        assert (view / "a/file").read_bytes() == b"x" * 100_000
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock", results[0].index.name]


def test_a_sweep_leaves_a_live_indexing_alone(layout, indexes, monkeypatch, tmp_path):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"live"))
    swept_meanwhile = []
    publish = layer_index._publish

    def sweep_first(temporary, final):
        swept_meanwhile.append((indexes.sweep(), temporary.is_file()))
        publish(temporary, final)

    monkeypatch.setattr(layer_index, "_publish", sweep_first)
    lower = indexes.index(layout, layer)
    assert swept_meanwhile == [([], True)]
    with mounted(lower, tmp_path / "view") as view:
        assert (view / "a/file").read_bytes() == b"live"


def test_a_killed_indexing_leaves_no_index_and_the_sweep_removes_it(layout, indexes, tmp_path):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"y" * 1_000_000))
    # The indexing stops just before its rename, says where its file is, and is killed there.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from builder.oci import layer_index\n"
        "from builder.oci.layout import Layout\n"
        "def stall(temporary, final):\n"
        "    print(temporary, flush=True)\n"
        "    time.sleep(600)\n"
        "layer_index._publish = stall\n"
        "layer_index.LayerIndexes(Path(sys.argv[1])).index(Layout(Path(sys.argv[2])), sys.argv[3])\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script, str(indexes.root), str(layout.root), layer], cwd=REPO,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        temporary = Path(process.stdout.readline().strip())
        assert temporary.stat().st_size > 0
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert not any(path.suffix == ".erofs" for path in indexes.root.iterdir())
    assert indexes.sweep() == [temporary.name]
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock"]
    with mounted(indexes.index(layout, layer), tmp_path / "view") as view:
        assert (view / "a/file").stat().st_size == 1_000_000


def truncated_layer() -> bytes:
    whole = layer_bytes(directory("a"), member("a/big", data=b"z" * 200_000))
    return whole[:100_000]


@pytest.mark.parametrize("blob", [b"this is not a tar archive\n" * 100, truncated_layer()],
                         ids=["not-tar", "truncated"])
def test_a_bad_blob_is_one_line_and_no_index(layout, indexes, blob):
    layer = layout.write_blob(blob).digest
    with pytest.raises(BuildFailure) as failure:
        indexes.index(layout, layer)
    message = str(failure.value)
    assert layer in message and "\n" not in message
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock"]


def test_without_mkfs_erofs_the_error_says_what_to_run(layout, indexes, monkeypatch):
    layer = add_layer(layout, member("file", data=b"f"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match="mkfs.erofs .*not on PATH: scripts/erofs-utils builds it"):
        indexes.index(layout, layer)


def test_a_whiteout_under_a_symbolic_link_is_refused(layout, indexes, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"safe")
    layer = add_layer(layout, member("evil", tarfile.SYMTYPE, link=str(outside)), member("evil/.wh.victim", mode=0))
    with pytest.raises(BuildFailure, match=f"layer {layer}: mkfs.erofs could not index it: "):
        indexes.index(layout, layer)
    assert sorted(outside.iterdir()) == [outside / "victim"] and (outside / "victim").read_bytes() == b"safe"
    assert sorted(path.name for path in indexes.root.iterdir()) == [".lock"]


def test_a_whiteout_named_through_dot_dot_stays_in_its_layer(layout, indexes, tmp_path):
    layer = add_layer(layout, directory("a"), member("a/../.wh.victim", mode=0))
    with mounted(indexes.index(layout, layer), tmp_path / "view") as view:
        assert describe(view) == {"a": ("dir", 0o755, 0, 0, seconds(EPOCH)),
                                  "victim": ("other", stat.S_IFCHR, os.makedev(0, 0))}


def test_a_stack_is_unmounted_and_removed_when_its_block_raises(layout, indexes, tmp_path):
    lower = indexes.index(layout, add_layer(layout, member("file", data=b"f")))
    scratch = tmp_path / "scratch"
    with pytest.raises(RuntimeError, match="the step failed"):
        with stacked([lower], scratch) as stack:
            (stack.merged / "written").write_bytes(b"w")
            assert stack.merged in mounts_below(scratch) and len(mounts_below(scratch)) == 2
            raise RuntimeError("the step failed")
    assert mounts_below(scratch) == []
    assert [path.name for path in scratch.iterdir()] == [".lock"]


def test_a_root_still_held_after_the_tries_is_detached_and_the_block_ends_cleanly(layout, indexes, tmp_path,
                                                                                monkeypatch):
    """A container's last process, slow to die, keeps its root busy past the unmount's tries: the root
    is detached, not left mounted, and the block ends without an error."""
    monkeypatch.setattr(overlay_mount, "_UNMOUNT_TRIES", 1)
    lower = indexes.index(layout, add_layer(layout, member("file", data=b"f")))
    scratch = tmp_path / "scratch"
    with contextlib.ExitStack() as holder:
        with stacked([lower], scratch) as stack:
            held = holder.enter_context((stack.merged / "file").open("rb"))  # open until after the block
        assert mounts_below(scratch) == []
        assert held.read() == b"f"  # the detached root still serves who holds it
    assert [path.name for path in scratch.iterdir()] == [".lock"]


def test_thirty_layers_with_long_paths_mount(tmp_path):
    # Each index's path is over 600 characters: named in full, thirty would not fit a page of options.
    layout = Layout.create(tmp_path / ("l" * 200) / ("a" * 200) / ("y" * 200))
    indexes = LayerIndexes(tmp_path / ("t" * 200) / ("r" * 200) / ("e" * 200))
    lowers = [indexes.index(layout, add_layer(layout, member(f"layer{number:02d}", data=str(number).encode()),
                                              member("top", data=str(number).encode())))
              for number in range(30)]
    assert len(":".join(str(lower.index) for lower in lowers)) > 4096
    with stacked(lowers, tmp_path / ("s" * 200) / "scratch") as stack:
        assert sorted(path.name for path in stack.merged.iterdir()) == [f"layer{n:02d}" for n in range(30)] + ["top"]
        assert (stack.merged / "top").read_bytes() == b"29"
        assert (stack.merged / "layer07").read_bytes() == b"7"


def test_a_layer_held_twice_stacks(layout, indexes, tmp_path):
    # overlayfs refuses a directory named twice; the image's view is the same with the topmost alone.
    repeated = indexes.index(layout, add_layer(layout, directory("d"), member("d/file", data=b"again")))
    between = indexes.index(layout, add_layer(layout, directory("d"), whiteout("d/file"), member("d/other")))
    with stacked([repeated, between, repeated], tmp_path / "scratch") as stack:
        assert sorted(path.name for path in (stack.merged / "d").iterdir()) == ["file", "other"]
        assert (stack.merged / "d/file").read_bytes() == b"again"


def test_a_mount_overlayfs_refuses_is_one_line_saying_why(layout, indexes, tmp_path):
    lower = indexes.index(layout, add_layer(layout, member("file", data=b"f")))
    # One layer 501 times under as many names: overlayfs takes 500 lower directories at most.
    lowers = [LayerIndex(f"sha256:{number:064x}", lower.index, lower.blob, False) for number in range(501)]
    scratch = tmp_path / "scratch"
    with pytest.raises(BuildFailure) as failure:
        with stacked(lowers, scratch):
            pass
    message = str(failure.value)
    assert message.startswith("overlay: mounting 501 layers on ") and "\n" not in message
    if os.access("/dev/kmsg", os.R_OK):
        assert "overlayfs: too many lower directories" in message
    assert [path.name for path in scratch.iterdir()] == [".lock"]
    assert mounts_below(scratch) == []


def test_a_missing_layer_is_one_line(layout, indexes, tmp_path):
    lower = indexes.index(layout, add_layer(layout, member("file", data=b"f")))
    gone = LayerIndex(lower.diff_id, tmp_path / "gone.erofs", lower.blob, False)
    with pytest.raises(BuildFailure, match=f"layer {lower.diff_id} is not there"):
        with stacked([gone], tmp_path / "scratch"):
            pass


def test_the_sweep_unmounts_what_a_killed_process_left(layout, indexes, tmp_path):
    lower = indexes.index(layout, add_layer(layout, member("file", data=b"f")))
    scratch = tmp_path / "scratch"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from builder.engine.overlay_mount import stacked\n"
        "from builder.oci.layer_index import LayerIndex\n"
        "lower = LayerIndex(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), False)\n"
        "with stacked([lower], Path(sys.argv[4])) as stack:\n"
        "    (stack.merged / 'written').write_bytes(b'w')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, lower.diff_id, str(lower.index), str(lower.blob),
                             str(scratch)], cwd=REPO, check=False)
    assert killed.returncode == -signal.SIGKILL
    [left] = [path for path in scratch.iterdir() if path.name != ".lock"]
    assert sorted(mounts_below(scratch)) == sorted([left / "merged", left / "0"])
    with stacked([lower], scratch):
        assert overlay_mount.sweep(scratch) == []  # a live stack here: nothing can be told dead
        assert left.is_dir()
    assert overlay_mount.sweep(scratch) == [left.name]
    assert mounts_below(scratch) == []
    assert [path.name for path in scratch.iterdir()] == [".lock"]


def _layer_entries(layout: Layout, diff_id: str) -> list[tuple[str, bytes]]:
    with tarfile.open(layout.blob_path(diff_id)) as tar:
        return [(member.name, member.type) for member in tar]


def test_a_steps_layer_is_read_from_the_upper_directory_alone(layout, indexes, tmp_path):
    """What a step changed on a stack, read from its upper directory (oci/tree_layer.py): a file and a
    directory of the layers removed (whiteouts), a directory of the layers removed and made again
    (opaque), new directories (never opaque, though overlayfs marks them), a directory copied up;
    then a second step on the same upper directory, whose layer repeats none of the first's."""
    base = add_layer(layout, directory("."), directory("etc"), member("etc/old", data=b"o"),
                     directory("opt"), directory("opt/remade"), member("opt/remade/x", data=b"x"),
                     directory("usr"), directory("usr/gone"), member("usr/gone/y", data=b"y"),
                     directory("var"), member("var/kept", data=b"k"))
    scratch = tmp_path / "work"
    scratch.mkdir()
    started = tree_layer.mark(scratch)
    with stacked([indexes.index(layout, base), indexes.index(layout, add_layer(layout, member("top")))],
                 tmp_path / "scratch") as stack:
        before = tree_layer.snapshot(stack.upper)
        since = tree_layer.mark(scratch)
        root = stack.merged
        (root / "etc/old").unlink()
        shutil.rmtree(root / "opt/remade")
        (root / "opt/remade").mkdir()
        (root / "opt/remade/z").write_bytes(b"z")
        shutil.rmtree(root / "usr/gone")
        (root / "var/new").mkdir()
        (root / "var/new/deeper").mkdir()
        (root / "made").mkdir()
        (root / "made/f").write_bytes(b"f")

        def step_layer(since_ns, snapshot):
            return tree_layer.write_step_layer(layout, root, stack.upper, since_ns, snapshot, EPOCH, drop_stubs=False,
                                               build_started_ns=started, lowers=stack.lowers)

        first, after = step_layer(since, before)
        assert _layer_entries(layout, first.diff_id) == [
            ("etc", tarfile.DIRTYPE), ("etc/.wh.old", tarfile.REGTYPE),
            ("made", tarfile.DIRTYPE), ("made/f", tarfile.REGTYPE),
            ("opt", tarfile.DIRTYPE), ("opt/remade", tarfile.DIRTYPE), ("opt/remade/.wh..wh..opq", tarfile.REGTYPE),
            ("opt/remade/z", tarfile.REGTYPE),
            ("usr", tarfile.DIRTYPE), ("usr/.wh.gone", tarfile.REGTYPE),  # its link names the first whiteout
            ("var", tarfile.DIRTYPE), ("var/new", tarfile.DIRTYPE), ("var/new/deeper", tarfile.DIRTYPE),
        ]
        since = tree_layer.mark(scratch)
        (root / "made/f").unlink()  # of the first step alone: no whiteout of the layers' to make it
        (root / "var/kept").write_bytes(b"changed")
        second, _ = step_layer(since, after)
        assert _layer_entries(layout, second.diff_id) == [
            ("made", tarfile.DIRTYPE), ("made/.wh.f", tarfile.REGTYPE),
            ("var", tarfile.DIRTYPE), ("var/kept", tarfile.REGTYPE),
        ]
