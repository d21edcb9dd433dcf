"""builder.oci.layer_diff: naming the first differing layer and its files, on hand-made archives and on a
real build with a planted non-determinism."""

import hashlib
import io
import json
import tarfile

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, tar_bytes, write_context

from builder.engine import storage_engine
from builder.engine.protocol import BuildRequest
from builder.errors import UserError
from builder.oci.layer_diff import (
    FileDifference, LayerRef, build_twice, compare, config_differences, layer_entries, read_image)


def docker_archive(path, layers, steps, created="2025-01-01T00:00:00Z"):
    """Write a docker-archive: one layer tar per entry of `layers` (dict name -> bytes)."""
    blobs = [tar_bytes(files) for files in layers]
    diff_ids = ["sha256:" + hashlib.sha256(blob).hexdigest() for blob in blobs]
    config = json.dumps({
        "created": created, "os": "linux", "architecture": "amd64",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "ENV A=1", "empty_layer": True}]
        + [{"created_by": step} for step in steps],
    }, sort_keys=True).encode()
    with tarfile.open(path, "w") as archive:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        add("config.json", config)
        names = []
        for index, blob in enumerate(blobs):
            names.append(f"layer{index}/layer.tar")
            add(names[-1], blob)
        add("manifest.json", json.dumps([{"Config": "config.json", "Layers": names}]).encode())
    return path


BASE_FILES = {"etc/os-release": b"debian\n"}
STEPS = ["base", "RUN date +%s%N > /built-at", "RUN echo done > /done"]


def test_equal_archives_are_identical(tmp_path):
    layers = [BASE_FILES, {"built-at": b"1\n"}, {"done": b"done\n"}]
    first = docker_archive(tmp_path / "a.tar", layers, STEPS)
    second = docker_archive(tmp_path / "b.tar", layers, STEPS)
    result = compare(first, second)
    assert result.identical and result.layer_index is None
    assert result.describe() == [f"identical: {result.first_id}"]


def test_first_differing_layer_and_file_are_named(tmp_path):
    first = docker_archive(tmp_path / "a.tar", [
        BASE_FILES, {"built-at": b"1700000000123\n", "same": b"x"}, {"done": b"1"}], STEPS)
    second = docker_archive(tmp_path / "b.tar", [
        BASE_FILES, {"built-at": b"1700000000999\n", "same": b"x", "extra": b"y"}, {"done": b"2"}], STEPS)
    result = compare(first, second)
    assert not result.identical
    assert result.layer_index == 1 and result.step == "RUN date +%s%N > /built-at"
    assert result.files == (
        FileDifference("built-at", "content"), FileDifference("extra", "only in second"))
    text = result.describe()
    assert text[1] == "first differing layer: #2 made by: RUN date +%s%N > /built-at"
    assert text[2:] == ["  built-at: content", "  extra: only in second"]


def test_config_only_difference_is_named(tmp_path):
    layers = [BASE_FILES]
    first = docker_archive(tmp_path / "a.tar", layers, ["base"], created="2025-01-01T00:00:00Z")
    second = docker_archive(tmp_path / "b.tar", layers, ["base"], created="2026-11-29T10:00:00Z")
    result = compare(first, second)
    assert result.layer_index is None and result.config_fields == ("created",)
    assert result.describe()[1] == "all layers equal; image config differs in: created"


def test_config_differences_give_paths():
    assert config_differences(
        {"config": {"Hostname": "a", "Env": ["X=1"]}, "history": [{"c": 1}, {"c": 2}]},
        {"config": {"Hostname": "b", "Env": ["X=1"]}, "history": [{"c": 1}, {"c": 3}]},
    ) == ("config.Hostname", "history[1].c")


def test_oci_layout_is_read(tmp_path):
    """Each layer is its own blob, in the manifest's order: a reader that took another blob (the
    config's, or the layers swapped) names the wrong files and fails here."""
    layers = [tar_bytes(BASE_FILES), tar_bytes({"built-at": b"1\n"})]
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = json.dumps({"rootfs": {"diff_ids": diff_ids},
                         "history": [{"created_by": "base"}, {"created_by": STEPS[1]}]}).encode()
    blobs = tmp_path / "layout" / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    config_digest = blob(config)
    manifest = json.dumps({"config": {"digest": config_digest},
                           "layers": [{"digest": blob(layer)} for layer in layers]}).encode()
    (tmp_path / "layout" / "index.json").write_text(json.dumps({"manifests": [{"digest": blob(manifest)}]}))
    image = read_image(tmp_path / "layout")
    assert image.config_digest == config_digest
    assert image.layers == tuple(
        LayerRef(diff_id, step, f"blobs/sha256/{diff_id.removeprefix('sha256:')}")
        for diff_id, step in zip(diff_ids, ["base", STEPS[1]]))
    files = [sorted((path, entry[6]) for path, entry in layer_entries(image, layer).items()) for layer in image.layers]
    assert files == [[("etc/os-release", hashlib.sha256(b"debian\n").hexdigest())],
                     [("built-at", hashlib.sha256(b"1\n").hexdigest())]]


def test_bad_inputs_say_what_is_wrong(tmp_path):
    with pytest.raises(UserError, match=f"^{tmp_path}/missing.tar: no such image archive or OCI layout$"):
        read_image(tmp_path / "missing.tar")
    (tmp_path / "plain.tar").write_bytes(tar_bytes({"a": b"1"}))
    with pytest.raises(UserError, match=r"plain.tar: not a docker-archive \(no manifest.json\)$"):
        read_image(tmp_path / "plain.tar")
    (tmp_path / "dir").mkdir()
    with pytest.raises(UserError, match=r"dir: not an OCI image layout \(no index.json\)$"):
        read_image(tmp_path / "dir")


@pytest.mark.engine
def test_planted_non_determinism_is_caught_with_its_layer_and_file(base_image, tmp_path):
    context = write_context(tmp_path / "ctx", f"""\
FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
RUN ["/bin/sh", "-c", "echo stable > /stable.txt"]
RUN ["/bin/sh", "-c", "date +%s%N > /built-at.txt"]
RUN ["/bin/sh", "-c", "echo after > /after.txt"]
""")
    request = BuildRequest(context_dir=context, dockerfile=context / "Dockerfile",
                           tags=["localhost/verify-test-planted:1"], source_date_epoch=EPOCH)
    two = build_twice(request, (base_image.archive,), tmp_path / "verify", storage_engine())
    assert two.image_ids[0] != two.image_ids[1]
    result = compare(*two.archives)
    assert result.layer_index == 2  # the base, the stable step, then the planted one
    assert result.step.endswith('"date +%s%N > /built-at.txt"]')
    assert result.files == (FileDifference("built-at.txt", "content"),)
    assert result.describe()[1].startswith("first differing layer: #3 made by: ")


def test_a_difference_names_both_engines_last_and_an_identical_result_stays_one_line():
    from builder.oci.layer_diff import Comparison
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    differ = Comparison(a, b, layer_index=1, step="RUN x", files=(FileDifference("opt/x", "mode"),),
                        first_engine="buildah 1.28.2 (matrix.lock)", second_engine="buildah 1.39.3 (this build)")
    assert differ.describe() == [
        f"digests differ: {a} != {b}", "first differing layer: #2 made by: RUN x", "  opt/x: mode",
        f"engines: buildah 1.28.2 (matrix.lock) made {a}, buildah 1.39.3 (this build) made {b}"]
    same = Comparison(a, a, first_engine="buildah 1.28.2", second_engine="buildah 1.39.3")
    assert same.describe() == [f"identical: {a}"]
