"""The refs of an OCI layout (builder/oci/layout.py) as the tags of the images the builder wrote
(builder/engine/written_images.py): names set together move in one index write or not at all, a
failed or killed writer leaves the index whole, concurrent writers lose nothing, and the candidate
names of dead runs are swept (engine/leftovers.py, the watchdog in engine/reaper.py). No engine needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from builder.engine import leftovers
from builder.engine.ownership import Owner
from builder.engine.written_images import WrittenImages, qualified
from builder.oci import canonical
from builder.oci import layout as layout_module
from builder.oci.layout import REF_ANNOTATION, Layout, LayoutError, digest_of
from checkouts import REPO


def image(layout: Layout, text: str) -> tuple[str, layout_module.Descriptor]:
    """A one-layer image in `layout`: its id and its manifest."""
    layer = layout.write_blob(text.encode())
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [layer.digest]},
                         "history": [{"created_by": f"write {text}"}], "created": "2025-01-01T00:00:00Z",
                         "config": {"Labels": {"text": text}}}).encode()
    manifest = layout.write_manifest(config, canonical.layer_descriptors([layer.digest], {layer.digest: layer.size}))
    return digest_of(config), manifest


def test_names_set_together_point_at_one_image_and_are_found_both_ways(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    first, manifest = image(layout, "one")
    layout.set_refs(["localhost/a:1", "localhost/a:moving"], manifest)
    assert layout.ref_image("localhost/a:1") == layout.ref_image("localhost/a:moving") == first
    assert layout.ref_names(first) == ("localhost/a:1", "localhost/a:moving")
    assert layout.ref_image("localhost/a:2") is None and layout.ref_names("sha256:" + "0" * 64) == ()
    entries = layout.index()["manifests"]
    assert [entry["annotations"][REF_ANNOTATION] for entry in entries] == ["localhost/a:1", "localhost/a:moving"]
    assert {entry["digest"] for entry in entries} == {manifest.digest}

    layout.remove_refs(["localhost/a:1", "localhost/never:1"])
    assert layout.ref_names() == ("localhost/a:moving",)


def test_names_move_together_in_one_index_write(tmp_path, monkeypatch):
    layout = Layout.create(tmp_path / "layout")
    first, one = image(layout, "one")
    second, two = image(layout, "two")
    layout.set_refs(["localhost/a:1", "localhost/a:moving", "localhost/b:1"], one)
    writes = []
    real = Layout.write_index
    monkeypatch.setattr(Layout, "write_index", lambda self, manifests: (writes.append(1), real(self, manifests)))
    layout.set_refs(["localhost/a:2", "localhost/a:moving"], two)
    assert len(writes) == 1
    assert layout.ref_images() == {"localhost/a:1": first, "localhost/a:2": second, "localhost/a:moving": second,
                                   "localhost/b:1": first}
    layout.set_refs(["localhost/a:2"], two)  # nothing changes: nothing written
    assert len(writes) == 1


def test_a_failed_index_write_moves_no_name_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    layout = Layout.create(tmp_path / "layout")
    _, one = image(layout, "one")
    _, two = image(layout, "two")
    layout.set_refs(["localhost/a:1", "localhost/a:moving"], one)
    before = (layout.root / "index.json").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("builder.files.os.replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        layout.set_refs(["localhost/a:2", "localhost/a:moving"], two)
    assert (layout.root / "index.json").read_bytes() == before
    assert not list(layout.root.glob(".index.json.*"))


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import builder.files
    from builder.oci.layout import Descriptor, Layout
    root, mode = Path(sys.argv[1]), sys.argv[2]
    layout = Layout(root)
    if mode == "stall":  # told to stop right before the rename that makes the new index
        real = builder.files.os.replace
        def stall(*args):
            print("renaming", flush=True)
            time.sleep(60)
            real(*args)
        builder.files.os.replace = stall
        layout.set_refs(["localhost/a:1", "localhost/a:moving"], Descriptor(sys.argv[3], int(sys.argv[4])))
    elif mode == "flip":  # both names between two manifests, in one write each, until killed
        manifests = [Descriptor(sys.argv[3], int(sys.argv[4])), Descriptor(sys.argv[5], int(sys.argv[6]))]
        print("flipping", flush=True)
        turn = 0
        while True:
            layout.set_refs(["localhost/a:1", "localhost/a:moving"], manifests[turn % 2])
            turn += 1
    else:  # "add": its own names, one write each
        for n in range(int(sys.argv[3])):
            layout.set_refs([f"localhost/{mode}:{n}"], Descriptor(sys.argv[4], int(sys.argv[5])))
""")


def writer(layout: Layout, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(layout.root), *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)


def test_a_writer_killed_while_tagging_leaves_the_old_index_whole_and_the_lock_free(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    first, one = image(layout, "one")
    second, two = image(layout, "two")
    layout.set_refs(["localhost/a:1", "localhost/a:moving"], one)
    before = (layout.root / "index.json").read_bytes()
    process = writer(layout, "stall", two.digest, two.size)
    assert process.stdout.readline().strip() == "renaming"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert (layout.root / "index.json").read_bytes() == before
    assert list(layout.root.glob(".index.json.*"))  # the new index, never renamed into place

    layout.set_refs(["localhost/b:1"], two)  # the kernel freed the lock; the dead writer's file goes
    assert layout.ref_images() == {"localhost/a:1": first, "localhost/a:moving": first, "localhost/b:1": second}
    assert not list(layout.root.glob(".index.json.*"))


def test_names_set_together_are_never_seen_apart_whenever_the_writer_is_killed(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    _, one = image(layout, "one")
    _, two = image(layout, "two")
    layout.set_refs(["localhost/a:1", "localhost/a:moving"], one)
    for delay in (0.0, 0.01, 0.03, 0.05, 0.08, 0.13):
        process = writer(layout, "flip", one.digest, one.size, two.digest, two.size)
        assert process.stdout.readline().strip() == "flipping"
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        refs = layout.refs()
        assert set(refs) == {"localhost/a:1", "localhost/a:moving"}
        assert refs["localhost/a:1"] == refs["localhost/a:moving"] in (one, two)


def test_concurrent_writers_lose_no_name(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    _, one = image(layout, "one")
    processes = [writer(layout, name, 25, one.digest, one.size) for name in ("p", "q", "r", "s")]
    for process in processes:
        assert process.wait(timeout=120) == 0
    assert layout.ref_names() == tuple(sorted(f"localhost/{name}:{n}" for name in "pqrs" for n in range(25)))


def test_a_layout_made_while_another_process_names_an_image_keeps_the_name(tmp_path):
    layout = Layout(tmp_path / "layout")
    layout.blobs.mkdir(parents=True)
    _, one = image(layout, "one")
    layout.set_refs(["localhost/a:1"], one)  # before anyone made the index
    Layout.create(layout.root)
    assert layout.ref_names() == ("localhost/a:1",)


@pytest.mark.parametrize("name, stored", [
    ("sglang:0.5.9-cu128", "localhost/sglang:0.5.9-cu128"),
    ("sglang-candidate:x-0123456789ab.host.12", "localhost/sglang-candidate:x-0123456789ab.host.12"),
    ("localhost/a:1", "localhost/a:1"),
    ("a", "localhost/a:latest"),
    ("team/a:1", "localhost/team/a:1"),
    ("registry.example:5000/a", "registry.example:5000/a:latest"),
    ("quay.io/team/a:1", "quay.io/team/a:1"),
])
def test_a_name_is_stored_as_buildah_spells_it(name, stored):
    assert qualified(name) == stored


def test_written_images_are_found_by_name_id_and_short_id_only_while_whole(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    first, one = image(layout, "one")
    written = WrittenImages(layout)
    written.name(["sglang:x", "sglang:moving"], first)
    assert [written.resolve(ref) for ref in ("sglang:x", "localhost/sglang:moving", first, first[7:], first[7:19])] \
        == [first] * 5
    assert written.resolve("sglang:y") is None and written.resolve("sha256:" + "0" * 64) is None
    info = written.info(first)
    assert info.tags == ("localhost/sglang:moving", "localhost/sglang:x") and info.labels == {"text": "one"}
    assert [(layer.size, layer.created_by) for layer in info.layers] == [(3, "write one")]
    assert digest_of(info.config_bytes) == first

    before = written.snapshot(["sglang:x", "sglang:new"])
    second, _ = image(layout, "two")
    written.name(["sglang:x", "sglang:new"], second)
    assert written.resolve("sglang:x") == written.resolve("sglang:new") == second
    written.restore(before)
    assert written.resolve("sglang:x") == first and written.resolve("sglang:new") is None

    written.remove(first)  # an id: every name of it
    assert layout.ref_names() == ()
    written.name(["sglang:x"], first)
    layout.remove_blob(layout.read_json(one.digest)["layers"][0]["digest"])
    assert written.resolve("sglang:x") is None  # a layer gone: not held
    with pytest.raises(LayoutError):
        written.name(["sglang:y"], first)


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_dead_runs_candidate_names_are_swept_and_nothing_else(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    _, one = image(layout, "one")
    host = Owner.current().host
    dead = f"localhost/sglang-candidate:0.5.9-cu128-0123456789ab.{host}.{dead_pid()}"
    kept = [f"localhost/sglang-candidate:0.5.9-cu128-0123456789ab.{host}.{os.getpid()}",  # alive
            "localhost/sglang-candidate:0.5.9-cu128-0123456789ab.elsewhere.1",  # another host's
            f"localhost/sglang:0.5.9-cu128-0123456789ab.{host}.1"]  # no candidate
    layout.set_refs([dead, *kept], one)

    nothing = SimpleNamespace(list=lambda **_: [])  # the API's store is empty: only the layout's names go
    swept = leftovers.sweep(SimpleNamespace(containers=nothing, images=nothing), leftovers.of_dead_runs, layout.root)
    assert swept.tags == (dead,) and layout.ref_names() == tuple(sorted(kept))


def test_the_watchdog_of_a_killed_run_removes_its_candidate_name_even_without_the_api(tmp_path):
    layout = Layout.create(tmp_path / "layout")
    _, one = image(layout, "one")
    owner = Owner(Owner.current().host, dead_pid())
    own = f"localhost/sglang-candidate:0.5.9-cu128-0123456789ab{owner.tag_suffix()}"
    other = f"localhost/sglang-candidate:0.5.9-cu128-0123456789ab.{owner.host}.{os.getpid()}"
    layout.set_refs([own, other], one)
    # The run died: its end of the watchdog's stdin closes with nothing said.
    reaper = subprocess.run([sys.executable, "-m", "builder.engine.reaper", "--api",
                             f"unix://{tmp_path}/no-such.sock", "--owner", owner.label(), "--layout", str(layout.root)],
                            cwd=REPO, input=b"", capture_output=True, timeout=120)
    assert reaper.returncode == 0, reaper.stderr
    assert b"could not sweep" in reaper.stderr and f"tag {own}".encode() in reaper.stderr
    assert layout.ref_names() == (other,)
