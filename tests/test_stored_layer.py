"""stored_layer.py joins a layer's tar-split record and its directory back into the tar. Here the record is
made from a tar Python wrote (each file's content left out, everything else kept as raw segments, as
containers/storage records it); the engine tests read real buildah storage (test_engine_versions)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile

import pytest

from builder.engine.stored_layer import LayerStream, OverlayStorage, UnreadableLayer

FILES = {"opt/a.txt": b"alpha\n" * 1000, "opt/empty": b"", "opt/sub/b.bin": bytes(range(256)) * 4097}


def layer_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("opt", "opt/sub"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, content in FILES.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 1700000000
            info.pax_headers = {"SCHILY.xattr.user.note": "kept"}
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def tar_split_lines(tar_bytes: bytes) -> list[dict]:
    """The record containers/storage keeps for `tar_bytes`: raw segments around each file's content."""
    lines, position, cursor = [], 0, 0
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r") as tar:
        members = tar.getmembers()
    for member in members:
        if member.isreg() and member.size:
            lines.append({"type": 2, "payload": base64.b64encode(tar_bytes[cursor:member.offset_data]).decode(),
                          "position": position})
            lines.append({"type": 1, "name": member.name, "size": member.size, "payload": None, "position": position + 1})
            position, cursor = position + 2, member.offset_data + member.size
    lines.append({"type": 2, "payload": base64.b64encode(tar_bytes[cursor:]).decode(), "position": position})
    return lines


def make_storage(root, lines: list[dict], files: dict[str, bytes], diff_id: str = "sha256:" + "1" * 64) -> OverlayStorage:
    layers = root / "overlay-layers"
    layers.mkdir(parents=True, exist_ok=True)
    (layers / "layers.json").write_text(json.dumps([{"id": "abc", "diff-digest": diff_id}]))
    with gzip.open(layers / "abc.tar-split.gz", "wt") as record:
        record.writelines(json.dumps(line) + "\n" for line in lines)
    diff = root / "overlay" / "abc" / "diff"
    for name, content in files.items():
        (diff / name).parent.mkdir(parents=True, exist_ok=True)
        (diff / name).write_bytes(content)
    diff.mkdir(parents=True, exist_ok=True)
    return OverlayStorage(root)


def read_all(stream: LayerStream, size: int) -> bytes:
    parts = []
    while data := stream.read(size):
        parts.append(data)
    return b"".join(parts)


@pytest.mark.parametrize("read_size", [1, 512, 7000, 1 << 20, -1])
def test_the_record_and_the_directory_give_the_tar_back_byte_for_byte(tmp_path, read_size):
    original = layer_tar()
    storage = make_storage(tmp_path, tar_split_lines(original), FILES)
    with storage.open("sha256:" + "1" * 64) as stream:
        assert read_all(stream, read_size) == original


def test_a_layer_the_storage_does_not_hold_is_none(tmp_path):
    storage = make_storage(tmp_path, tar_split_lines(layer_tar()), FILES)
    assert storage.open("sha256:" + "2" * 64) is None
    assert OverlayStorage(tmp_path / "nowhere").open("sha256:" + "1" * 64) is None


@pytest.mark.parametrize(("damage", "message"), [
    (lambda files, lines: files.pop("opt/sub/b.bin"), "opt/sub/b.bin in .*: No such file or directory"),
    (lambda files, lines: files.update({"opt/a.txt": b"short"}), "opt/a.txt in .* is shorter than its tar entry"),
    (lambda files, lines: lines.insert(1, {"type": 7, "payload": None}), "unknown tar-split entry type 7"),
    (lambda files, lines: lines.insert(1, {"type": 2, "payload": "not base64!"}), "tar-split record: "),
    (lambda files, lines: lines[1].update({"name": "../../etc/passwd"}), "tar-split names a file outside the layer"),
])
def test_a_record_that_does_not_match_the_directory_is_unreadable_not_a_shorter_tar(tmp_path, damage, message):
    files, lines = dict(FILES), tar_split_lines(layer_tar())
    damage(files, lines)
    storage = make_storage(tmp_path, lines, files)
    with storage.open("sha256:" + "1" * 64) as stream, pytest.raises(UnreadableLayer, match=message):
        read_all(stream, 1 << 20)


def test_a_name_the_record_keeps_as_raw_bytes_is_found(tmp_path):
    original = layer_tar()
    lines = tar_split_lines(original)
    raw = [line for line in lines if line.get("name") == "opt/a.txt"][0]
    raw["name_raw"] = base64.b64encode(b"./opt/a.txt").decode()
    raw["name"] = "ignored when name_raw is there"
    storage = make_storage(tmp_path, lines, FILES)
    with storage.open("sha256:" + "1" * 64) as stream:
        assert read_all(stream, -1) == original
