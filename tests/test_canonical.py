"""builder.oci.canonical: the layer and config form every buildah version gives alike, on hand-made tars
that reproduce what 1.28.2 and 1.39.3 write (measured: docs/engines.md)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from builder.engine import canonical_preview
from builder.errors import BuildFailure
from builder.oci import canonical

EPOCH = 1735689600
LONG = "opt/venv/lib/python3.11/site-packages/" + "a" * 120 + "/__init__.py"


def engine_tar(type_bits: bool, stub_mode: int, uname: str = "", pax_time: bool = False) -> bytes:
    """A RUN layer as buildah writes it: 1.28.2 puts the file type into the mode field (type_bits),
    1.39.3 does not; both leave an empty etc/hostname whose mode differs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, kind, mode, data=b"", link="", xattrs=None):
            info = tarfile.TarInfo(name)
            info.type, info.mtime, info.linkname, info.uname, info.gname = kind, EPOCH, link, uname, uname
            type_mode = {tarfile.DIRTYPE: 0o040000, tarfile.SYMTYPE: 0o120000}.get(kind, 0o100000)
            info.mode = mode | (type_mode if type_bits else 0)
            info.size = len(data)
            info.pax_headers = dict(xattrs or {})
            if pax_time:
                info.pax_headers["atime"] = "1735689600.123"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("etc", tarfile.DIRTYPE, 0o755)
        add("etc/hostname", tarfile.REGTYPE, stub_mode)
        add("opt", tarfile.DIRTYPE, 0o755)
        add("opt/x", tarfile.REGTYPE, 0o4755, b"hi\n", xattrs={"SCHILY.xattr.user.b": "2", "SCHILY.xattr.user.a": "1"})
        add("opt/y", tarfile.SYMTYPE, 0o777, link="x")
        add("opt/z", tarfile.LNKTYPE, 0o4755, link="opt/x")
        add(LONG, tarfile.REGTYPE, 0o644, b"long\n")
        add("tmp", tarfile.DIRTYPE, 0o1777)
    return buffer.getvalue()


def rewrite(data: bytes, drop_stubs: bool = True) -> tuple[canonical.CanonicalLayer, bytes]:
    sink = io.BytesIO()
    made = canonical.rewrite_layer(io.BytesIO(data), sink, drop_stubs, "sha256:" + hashlib.sha256(data).hexdigest())
    return made, sink.getvalue()


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_both_engine_versions_layers_become_one():
    old, new = engine_tar(type_bits=True, stub_mode=0o755), engine_tar(type_bits=False, stub_mode=0o644)
    assert old != new
    (made_old, out_old), (made_new, out_new) = rewrite(old), rewrite(new)
    assert made_old.diff_id == made_new.diff_id and out_old == out_new
    assert made_old.diff_id == "sha256:" + hashlib.sha256(out_old).hexdigest()
    assert made_old.size == len(out_old)
    assert made_old.dropped == ("etc/hostname",)


def test_the_canonical_entries_keep_everything_but_type_bits_names_and_stubs():
    _, out = rewrite(engine_tar(type_bits=True, stub_mode=0o755, uname="root", pax_time=True))
    entries = members(out)
    assert list(entries) == ["etc", "opt", "opt/x", "opt/y", "opt/z", LONG, "tmp"]  # the engine's order
    assert {name: oct(m.mode) for name, m in entries.items()} == {
        "etc": "0o755", "opt": "0o755", "opt/x": "0o4755", "opt/y": "0o777", "opt/z": "0o4755",
        LONG: "0o644", "tmp": "0o1777"}
    assert all(m.uname == m.gname == "" and m.mtime == EPOCH for m in entries.values())
    assert entries["opt/y"].linkname == "x" and entries["opt/z"].islnk() and entries["opt/z"].linkname == "opt/x"
    assert entries["opt/x"].pax_headers == {"SCHILY.xattr.user.a": "1", "SCHILY.xattr.user.b": "2"}
    assert "atime" not in entries["opt/x"].pax_headers
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        assert tar.extractfile(LONG).read() == b"long\n"


def test_stubs_stay_where_no_run_step_made_the_layer_and_when_not_empty():
    made, out = rewrite(engine_tar(type_bits=False, stub_mode=0o644), drop_stubs=False)
    assert made.dropped == () and "etc/hostname" in members(out)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/hosts")
        info.size = 10
        tar.addfile(info, io.BytesIO(b"127.0.0.1\n"))
    made, out = rewrite(buffer.getvalue())
    assert made.dropped == () and members(out)["etc/hosts"].size == 10


@pytest.mark.parametrize("cut", [1536, 2000, 512 * 12])
def test_a_short_or_other_layer_is_an_error_not_a_smaller_image(cut):
    data = engine_tar(type_bits=False, stub_mode=0o644)
    expected = "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(BuildFailure, match=r"reads as sha256:[0-9a-f]{64}; not rewritten|is no readable tar"):
        canonical.rewrite_layer(io.BytesIO(data[:cut]), io.BytesIO(), True, expected)


@pytest.mark.parametrize(("step", "ran"), [
    ("|2 BUILD_NETWORK=none SOURCE_DATE_EPOCH=1 /bin/sh -c python3 -m venv /opt/venv", True),
    ('/usr/bin/python3.11 -m venv /opt/venv', True),
    ("/bin/sh -c #(nop) COPY file:87c795a1e3e18049905e07b82affce1af157e2b015ba04257306df836f66869b in /a ", False),
    ("/bin/sh -c #(nop) ENV A=1", False),
])
def test_run_steps_are_told_from_copy_and_metadata_steps(step, ran):
    assert canonical.is_run_step(step) is ran


def native_config(comment_ids: bool, copy_digest: str) -> dict:
    base = [{"created": "2026-01-01T00:00:00Z", "created_by": "mmdebstrap", "comment": "kept: the base's own"}]
    built = [
        {"created": "2025-01-01T00:00:00Z", "created_by": "/bin/sh -c #(nop) ARG A", "empty_layer": True,
         "comment": "FROM localhost/base"},
        {"created": "2025-01-01T00:00:00Z", "created_by": "/bin/sh -c python3 -m venv /opt/venv"},
        {"created": "2025-01-01T00:00:00Z", "created_by": f"/bin/sh -c #(nop) COPY file:{copy_digest} in /a "},
    ]
    if comment_ids:
        built[1]["comment"], built[2]["comment"] = "FROM 600f1c4ca75f", "FROM 33cc673877e3"
    return {"created": "2025-01-01T00:00:00Z", "architecture": "amd64", "os": "linux",
            "config": {"Env": ["A=1"]}, "rootfs": {"type": "layers", "diff_ids": ["sha256:b", "sha256:n1", "sha256:n2"]},
            "history": base + built}


def test_the_config_is_the_same_for_both_versions_and_keeps_the_base_history():
    old = canonical.canonical_config(native_config(True, "87" * 32), ["sha256:b", "sha256:c1", "sha256:c2"], 1)
    new = canonical.canonical_config(native_config(False, "fc" * 32), ["sha256:b", "sha256:c1", "sha256:c2"], 1)
    assert old == new
    config = json.loads(old)
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:b", "sha256:c1", "sha256:c2"]}
    assert config["history"][0]["comment"] == "kept: the base's own"
    assert all("comment" not in h for h in config["history"][1:])
    assert config["history"][3]["created_by"] == "/bin/sh -c #(nop) COPY file in /a "
    assert config["history"][1]["empty_layer"] is True
    assert old == json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def test_a_run_steps_mount_digest_is_left_out_as_1_28_writes_it():
    """1.39 appends the digest of a bind mount's source to the RUN step; the inputs hash covers that source."""
    step = "|1 SOURCE_DATE_EPOCH=1767225600 /bin/sh -c --mount=type=bind,source=wheels,target=/run/wheels,ro pip i"
    new = canonical.canonical_history_entry({"created_by": f"{step}:sha256:{'42' * 32}"})
    assert new == canonical.canonical_history_entry({"created_by": step}) == {"created_by": step}
    # Only a mount's digest goes: a RUN step of no mount, or a COPY, keeps a text that ends the same way.
    plain = f"/bin/sh -c echo x:sha256:{'42' * 32}"
    assert canonical.canonical_history_entry({"created_by": plain})["created_by"] == plain


def test_different_steps_still_give_different_configs():
    changed = native_config(False, "fc" * 32)
    changed["history"][2]["created_by"] = "/bin/sh -c python3 -m venv /opt/other"
    assert canonical.canonical_config(changed, ["sha256:b"], 1) != \
        canonical.canonical_config(native_config(False, "fc" * 32), ["sha256:b"], 1)


class _Pipe(io.RawIOBase):
    """A stream that can only be read forward, as buildah's archive in a pipe."""

    def __init__(self, data: bytes) -> None:
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)


def test_the_preview_reads_a_layer_once_and_spools_only_one_used_both_ways(tmp_path):
    data = engine_tar(type_bits=True, stub_mode=0o755)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    kept, dropped = rewrite(data, drop_stubs=False)[0].diff_id, rewrite(data)[0].diff_id
    assert kept != dropped
    assert canonical_preview._rewritten(_Pipe(data), diff_id, [True], tmp_path) == {(diff_id, True): dropped}
    assert canonical_preview._rewritten(_Pipe(data), diff_id, [False, True], tmp_path) == {
        (diff_id, False): kept, (diff_id, True): dropped}
    assert list(tmp_path.iterdir()) == []  # the spool went


@pytest.mark.parametrize(("name", "layer"), [
    (f"{'ab' * 32}.tar", "ab" * 32), (f"{'ab' * 32}/layer.tar", "ab" * 32),
    (f"{'ab' * 32}.json", None), ("manifest.json", None), (f"{'AB' * 32}.tar", None), (f"../{'ab' * 32}.tar", None),
])
def test_the_preview_knows_a_layer_in_buildahs_archive_by_its_name(name, layer):
    found = canonical_preview._LAYER_MEMBER.match(name)
    assert (found.group(1) if found else None) == layer
