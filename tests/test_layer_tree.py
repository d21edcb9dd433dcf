"""Layer trees (builder/oci/layer_tree.py) and their overlay stacks (builder/engine/overlay_mount.py):
layers made by hand, extracted, stacked and read back through the merged view. Needs root (mknod,
trusted.* xattrs, mount)."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from builder.engine import overlay_mount
from builder.engine.overlay_mount import stacked
from builder.errors import BuildFailure
from builder.files import mounts_below
from builder.oci import layer_tree
from builder.oci.layer_tree import LayerTrees
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
def trees(tmp_path) -> LayerTrees:
    return LayerTrees(tmp_path / "trees")


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
        # overlayfs's attributes from a tar would steer the stack: this one must not hide the base's bin/.
        directory("bin", mtime=T3, xattrs={"trusted.overlay.opaque": "y"}),
        whiteout("bin/shell"),
        directory("usr", mtime=T3),
        directory("usr/local", mtime=T3),
        member("usr/local/tool", data=b"tool", mode=0o750, uid=123, gid=456, mtime=T3),
    )
    return [base, second, third]


def test_a_tree_is_the_layer_as_overlayfs_reads_a_lower_directory(layout, trees):
    _, second, third = three_layers(layout)
    tree = trees.tree(layout, second)
    assert tree == trees.root / hex_of(second)
    assert describe(tree) == {
        "etc": ("dir", 0o755, 0, 0, seconds(T2)),  # its time as the tar says, after the whiteout was made
        "etc/gone": ("other", stat.S_IFCHR, os.makedev(0, 0)),
        "etc/passwd": ("file", 0o644, 0, 0, seconds(T2), b"root:x:0:0\nuser:x:1000"),
        "etc/x.wh.y": ("file", 0o644, 0, 0, seconds(T2), b"not a whiteout"),
        "opt": ("dir", 0o750, 0, 0, seconds(T2)),
        "opt/new": ("file", 0o644, 0, 0, seconds(T2), b"new"),
    }
    assert os.getxattr(tree / "opt", "trusted.overlay.opaque") == b"y"
    assert "trusted.overlay.opaque" not in os.listxattr(tree / "etc")
    assert "trusted.overlay.opaque" not in os.listxattr(trees.tree(layout, third) / "bin")
    assert stat.S_IMODE(tree.stat().st_mode) == 0o755  # no "./" entry: the root as overlayfs would make it


def test_stacked_layers_show_the_image(layout, trees, tmp_path):
    layers = three_layers(layout)
    lowers = [trees.tree(layout, diff_id) for diff_id in layers]
    base_before = describe(lowers[0])
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
        assert stat.S_IMODE(merged.stat().st_mode) == stat.S_IMODE(lowers[-1].stat().st_mode)
        # A step's changes land in the upper directory; the trees stay as they were.
        (merged / "etc/passwd").write_bytes(b"changed")
        (merged / "bin/sh").unlink()
        (merged / "opt/made").write_bytes(b"made")
        upper = describe(stack.upper)
        assert upper["etc/passwd"][-1] == b"changed" and upper["opt/made"][-1] == b"made"
        assert upper["bin/sh"] == ("other", stat.S_IFCHR, os.makedev(0, 0))
    assert describe(lowers[0]) == base_before
    assert lowers[0].stat().st_mtime_ns == seconds(T1)  # the layer's "./" entry
    assert [path.name for path in (tmp_path / "scratch").iterdir()] == [".lock"]


def test_the_same_layer_is_extracted_once(layout, trees):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"one"))
    first = trees.tree(layout, layer)
    identity = (first.stat().st_ino, (first / "a/file").stat().st_ino)
    assert trees.tree(layout, layer) == first
    assert (first.stat().st_ino, (first / "a/file").stat().st_ino) == identity
    assert sorted(path.name for path in trees.root.iterdir()) == [".lock", hex_of(layer)]


def test_two_extractions_at_once_both_end_with_the_tree(layout, trees, monkeypatch):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"x" * 100_000), whiteout("a/gone"))
    both_extracted = threading.Barrier(2, timeout=60)
    publish = layer_tree._publish

    def publish_together(temporary, final):
        both_extracted.wait()
        publish(temporary, final)

    monkeypatch.setattr(layer_tree, "_publish", publish_together)
    results: list[Path | BaseException] = []

    def extract():
        try:
            results.append(trees.tree(layout, layer))
        except BaseException as error:  # handed to the test's thread
            results.append(error)

    threads = [threading.Thread(target=extract) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [trees.root / hex_of(layer)] * 2
    assert set(describe(results[0])) == {"a", "a/file", "a/gone"}
    assert (results[0] / "a/file").read_bytes() == b"x" * 100_000
    assert sorted(path.name for path in trees.root.iterdir()) == [".lock", hex_of(layer)]


def test_a_sweep_leaves_a_live_extraction_alone(layout, trees, monkeypatch):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"live"))
    swept_meanwhile = []
    publish = layer_tree._publish

    def sweep_first(temporary, final):
        swept_meanwhile.append((trees.sweep(), temporary.is_dir()))
        publish(temporary, final)

    monkeypatch.setattr(layer_tree, "_publish", sweep_first)
    tree = trees.tree(layout, layer)
    assert swept_meanwhile == [([], True)]
    assert (tree / "a/file").read_bytes() == b"live"


def test_a_killed_extraction_leaves_no_tree_and_the_sweep_removes_it(layout, trees):
    layer = add_layer(layout, directory("a"), member("a/file", data=b"y" * 1_000_000))
    # The extraction stops just before its rename, says where its copy is, and is killed there.
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from builder.oci import layer_tree\n"
        "from builder.oci.layout import Layout\n"
        "def stall(temporary, final):\n"
        "    print(temporary, flush=True)\n"
        "    time.sleep(600)\n"
        "layer_tree._publish = stall\n"
        "layer_tree.LayerTrees(Path(sys.argv[1])).tree(Layout(Path(sys.argv[2])), sys.argv[3])\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script, str(trees.root), str(layout.root), layer], cwd=REPO,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        temporary = Path(process.stdout.readline().strip())
        assert (temporary / "a/file").stat().st_size == 1_000_000
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert not (trees.root / hex_of(layer)).exists()
    assert trees.sweep() == [temporary.name]
    assert sorted(path.name for path in trees.root.iterdir()) == [".lock"]
    assert (trees.tree(layout, layer) / "a/file").stat().st_size == 1_000_000


def truncated_layer() -> bytes:
    whole = layer_bytes(directory("a"), member("a/big", data=b"z" * 200_000))
    return whole[:100_000]


@pytest.mark.parametrize("blob", [b"this is not a tar archive\n" * 100, truncated_layer()],
                         ids=["not-tar", "truncated"])
def test_a_bad_blob_is_one_line_and_no_tree(layout, trees, blob):
    layer = layout.write_blob(blob).digest
    with pytest.raises(BuildFailure) as failure:
        trees.tree(layout, layer)
    message = str(failure.value)
    assert layer in message and "\n" not in message
    assert "tar" in message
    assert sorted(path.name for path in trees.root.iterdir()) == [".lock"]


@pytest.mark.parametrize("entries", [
    lambda outside: [member("evil", tarfile.SYMTYPE, link=str(outside)), member("evil/.wh.victim", mode=0)],
    lambda outside: [directory("a"), member("a/../.wh.victim", mode=0)],
], ids=["under-a-symlink", "dot-dot"])
def test_a_whiteout_never_reaches_out_of_its_tree(layout, trees, tmp_path, entries):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"safe")
    layer = add_layer(layout, *entries(outside))
    with pytest.raises(BuildFailure, match="whiteout"):
        trees.tree(layout, layer)
    assert (outside / "victim").read_bytes() == b"safe"
    assert sorted(path.name for path in trees.root.iterdir()) == [".lock"]


def test_a_stack_is_unmounted_and_removed_when_its_block_raises(layout, trees, tmp_path):
    lower = trees.tree(layout, add_layer(layout, member("file", data=b"f")))
    scratch = tmp_path / "scratch"
    with pytest.raises(RuntimeError, match="the step failed"):
        with stacked([lower], scratch) as stack:
            (stack.merged / "written").write_bytes(b"w")
            assert mounts_below(scratch) == [stack.merged]
            raise RuntimeError("the step failed")
    assert mounts_below(scratch) == []
    assert [path.name for path in scratch.iterdir()] == [".lock"]
    assert not (lower / "written").exists()


def test_thirty_layers_with_long_paths_mount(layout, tmp_path):
    # Each tree's path is over 600 characters: named in full, thirty would not fit a page of options.
    trees = LayerTrees(tmp_path / ("t" * 200) / ("r" * 200) / ("e" * 200))
    lowers = [trees.tree(layout, add_layer(layout, member(f"layer{number:02d}", data=str(number).encode()),
                                           member("top", data=str(number).encode())))
              for number in range(30)]
    assert len(":".join(str(lower) for lower in lowers)) > 4096
    with stacked(lowers, tmp_path / ("s" * 200) / "scratch") as stack:
        assert sorted(path.name for path in stack.merged.iterdir()) == [f"layer{n:02d}" for n in range(30)] + ["top"]
        assert (stack.merged / "top").read_bytes() == b"29"
        assert (stack.merged / "layer07").read_bytes() == b"7"


def test_a_layer_held_twice_stacks(layout, trees, tmp_path):
    # overlayfs refuses a directory named twice; the image's view is the same with the topmost alone.
    repeated = trees.tree(layout, add_layer(layout, directory("d"), member("d/file", data=b"again")))
    between = trees.tree(layout, add_layer(layout, directory("d"), whiteout("d/file"), member("d/other")))
    with stacked([repeated, between, repeated], tmp_path / "scratch") as stack:
        assert sorted(path.name for path in (stack.merged / "d").iterdir()) == ["file", "other"]
        assert (stack.merged / "d/file").read_bytes() == b"again"


def test_a_mount_overlayfs_refuses_is_one_line_saying_why(tmp_path):
    lowers = [tmp_path / "lowers" / str(number) for number in range(501)]
    for lower in lowers:
        lower.mkdir(parents=True)
    scratch = tmp_path / "scratch"
    with pytest.raises(BuildFailure) as failure:
        with stacked(lowers, scratch):
            pass
    message = str(failure.value)
    assert message.startswith("overlay: mounting 501 layers on ") and "\n" not in message
    if os.access("/dev/kmsg", os.R_OK):
        assert "overlayfs: too many lower directories" in message
    assert [path.name for path in scratch.iterdir()] == [".lock"]


def test_a_missing_layer_directory_is_one_line(tmp_path):
    with pytest.raises(BuildFailure, match="layer directory .*gone is not there"):
        with stacked([tmp_path / "gone"], tmp_path / "scratch"):
            pass


def test_the_sweep_unmounts_what_a_killed_process_left(layout, trees, tmp_path):
    lower = trees.tree(layout, add_layer(layout, member("file", data=b"f")))
    scratch = tmp_path / "scratch"
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from builder.engine.overlay_mount import stacked\n"
        "with stacked([Path(sys.argv[1])], Path(sys.argv[2])) as stack:\n"
        "    (stack.merged / 'written').write_bytes(b'w')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(lower), str(scratch)], cwd=REPO, check=False)
    assert killed.returncode == -signal.SIGKILL
    [left] = [path for path in scratch.iterdir() if path.name != ".lock"]
    assert mounts_below(scratch) == [left / "merged"]
    with stacked([lower], scratch):
        assert overlay_mount.sweep(scratch) == []  # a live stack here: nothing can be told dead
        assert left.is_dir()
    assert overlay_mount.sweep(scratch) == [left.name]
    assert mounts_below(scratch) == []
    assert [path.name for path in scratch.iterdir()] == [".lock"]
    assert sorted(path.name for path in lower.iterdir()) == ["file"]


def test_trees_of_an_earlier_boot_are_swept_and_this_boots_kept(tmp_path):
    """Trees are not synced when made, so none outlives a restart: the ones of another boot go."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    current = layer_tree.for_this_boot(tmp_path)
    assert current.root == tmp_path / boot
    (current.root / "kept").mkdir(parents=True)
    (tmp_path / "0f0f-an-earlier-boot" / "stale").mkdir(parents=True)
    assert layer_tree.sweep_other_boots(tmp_path) == ["0f0f-an-earlier-boot"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [boot]
    assert (current.root / "kept").is_dir()
