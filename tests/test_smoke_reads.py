"""Smoke results kept with what each check read: the read tracer, an image's files from its layer tars,
and when a kept result stands in another image."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builder.oci import layer_listing
from builder.runtime.smoke import report as smoke_report
from builder.smoke import read_tracer
from builder.smoke.image_files import ABSENT, ImageFiles
from builder.smoke import keyed_results
from builder.smoke.keyed_results import KeyedResults, Reads, identities, parse_traces, results_of

REPO = Path(__file__).resolve().parents[1]
TRACER_DIR = REPO / "builder" / "smoke" / "read_tracer"


# -- the tracer, in a process of this interpreter -------------------------------------------------

def traced(tmp_path: Path, code: str) -> Reads:
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"  # each run's records apart
    out.mkdir()
    environment = dict(os.environ, BUILDER_READS_OUT=str(out), PYTHONPATH=f"{TRACER_DIR}:{REPO}")
    subprocess.run([sys.executable, "-c", code], env=environment, check=False, cwd=tmp_path)
    return parse_traces(path.read_text() for path in sorted(out.iterdir()))


def test_the_tracer_records_files_read_listings_stats_and_its_traced_children(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "written.txt").write_text("")
    reads = traced(tmp_path, (
        "import os, subprocess, sys\n"
        f"open({str(tmp_path / 'data.txt')!r}).read()\n"
        f"open({str(tmp_path / 'written.txt')!r}, 'w').write('y')\n"
        f"os.listdir({str(tmp_path)!r}); os.path.exists('/no/such/path')\n"
        "subprocess.run([sys.executable, '-c', 'open(\"/etc/hostname\").read()'], check=True)\n"))
    assert reads.complete
    assert ("read", str(tmp_path / "data.txt")) in reads.entries
    assert ("read", str(tmp_path / "written.txt")) not in reads.entries  # written, not read
    assert ("list", str(tmp_path)) in reads.entries
    assert ("stat", "/no/such/path") in reads.entries
    assert ("read", "/etc/hostname") in reads.entries  # the child's read
    assert not any(kind == "any" for kind, _ in reads.entries)
    # the interpreter and the modules it loaded before the hook went in
    assert ("read", os.path.realpath(sys.executable)) in reads.entries
    assert ("read", os.path.abspath(os.__file__)) in reads.entries


def test_another_program_or_an_untraced_child_reads_everything(tmp_path):
    reads = traced(tmp_path, "import subprocess; subprocess.run(['true'])")
    assert ("any", "true") in reads.entries
    # a query program whose reads follow from its arguments (the loader's cache, for `ldconfig -p`)
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    reads = traced(tmp_path, f"import subprocess; subprocess.run([{ldconfig!r}, '-p'], capture_output=True)")
    assert ("read", "/etc/ld.so.cache") in reads.entries and ("read", ldconfig) in reads.entries
    assert not any(kind == "any" for kind, _ in reads.entries)
    reads = traced(tmp_path, f"import subprocess; subprocess.run([{ldconfig!r}, '--version'], capture_output=True)")
    assert ("any", ldconfig) in reads.entries  # any other use of it is not known to read only that
    reads = traced(tmp_path, "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], env={})")
    assert any(kind == "any" for kind, _ in reads.entries)


def test_a_process_that_dies_leaves_an_incomplete_record(tmp_path):
    reads = traced(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert not reads.complete


def test_the_stack_description_is_read_by_field(tmp_path):
    stack = tmp_path / "stack.json"
    stack.write_text(json.dumps({"schema": 2, "cuda": "13.0.1", "bench": {"input_len": 1}, "target_arch": ["12.0"],
                                 "patches": [{"files": ["a.py"], "sha256": "1"}, {"files": ["b.py"], "sha256": "2"}]}))

    def fields(code: str) -> set[str]:
        reads = traced(tmp_path, f"import json\nfrom builder.runtime import stackinfo\n"
                                 f"info = stackinfo.load({str(stack)!r})\n{code}")
        assert ("read", str(stack)) not in reads.entries  # its file is not a read of every field
        return {path.split("\t", 1)[1] for kind, path in reads.entries if kind == "field"}

    assert fields("info['cuda']") == {'["schema"]', '["cuda"]'}
    # the patch series: its length and the files of each patch, not their hashes
    assert fields("[p['files'] for p in info['patches']]") == {
        '["schema"]', '["patches", "#length"]', '["patches", 0, "files"]', '["patches", 1, "files"]'}
    assert '["target_arch"]' in fields("len(info['target_arch'])")
    everything = fields("json.dumps(info)")
    assert {'["#keys"]', '["bench", "input_len"]', '["patches", 1, "sha256"]', '["target_arch"]'} <= everything


def test_the_archive_put_into_a_container_holds_the_tracer_and_a_shared_output_directory():
    with tarfile.open(fileobj=io.BytesIO(read_tracer.archive())) as tar:
        members = {member.name: member for member in tar}
    assert members["builder-reads/out"].mode == 0o1777
    assert members["builder-reads/lib/sitecustomize.py"].size == (TRACER_DIR / "sitecustomize.py").stat().st_size
    environment = read_tracer.environment("/opt")
    assert environment["PYTHONPATH"] == f"{read_tracer.LIBRARY}:/opt"


# -- an image's files from its layers ----------------------------------------------------------------

def layer(tmp_path: Path, name: str, entries: list[tuple]) -> tuple[str, Path]:
    """A layer tar of (path, kind[, data or target]) entries; the diff_id is made up from the name."""
    path = tmp_path / f"{name}.tar"
    with tarfile.open(path, "w") as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry[0])
            kind = entry[1]
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, entry[2]
                tar.addfile(info)
            else:
                data = entry[2] if len(entry) > 2 else b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return f"sha256:{name * 64}"[:71], path


@pytest.fixture
def three_layers(tmp_path):
    base = layer(tmp_path, "a", [("usr", "dir"), ("usr/lib", "dir"), ("usr/lib/libx.so", "file", b"x"),
                                 ("lib", "link", "usr/lib"), ("opt", "dir"), ("opt/old", "dir"),
                                 ("opt/old/f", "file"), ("etc", "dir"), ("etc/gone", "file")])
    middle = layer(tmp_path, "b", [("opt", "dir"), ("opt/old", "dir"), ("opt/old/.wh..wh..opq", "file"),
                                   ("opt/old/g", "file"), ("etc", "dir"), ("etc/.wh.gone", "file"),
                                   ("opt/stack.json", "file", json.dumps({"schema": 2, "cuda": "12"}).encode())])
    top = layer(tmp_path, "c", [("usr", "dir"), ("usr/lib", "dir"), ("usr/lib/liby.so", "file")])
    return [base, middle, top]


def test_the_merged_view_applies_whiteouts_opaque_directories_and_links(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    a, b, c = (diff_id for diff_id, _ in three_layers)
    libx = files.identity("/usr/lib/libx.so")
    assert libx.startswith("file#sha256:")  # a small layer's file: named by its bytes
    assert files.identity("/lib/libx.so") == f"/lib->usr/lib@{a}|{libx}"  # the link is part of the read
    assert files.identity("/opt/old/f") == ABSENT  # hidden by the opaque directory
    assert files.identity("/opt/old/g") not in (ABSENT, libx)
    assert files.identity("/etc/gone") == ABSENT
    assert files.identity("/usr/lib") == "dir"  # not the layer that last carried its entry
    assert files.listing("/usr/lib") != files.listing("/opt/old")
    assert files.listing("/nowhere") == ABSENT
    assert json.loads(files.read_small("/opt/stack.json")) == {"schema": 2, "cuda": "12"}
    # the listings are kept by diff_id: the next view reads no tar
    for _, path in three_layers:
        path.unlink()
    again = ImageFiles([(diff_id, tmp_path / "none") for diff_id, _ in three_layers], tmp_path / "listings")
    assert again.identity("/opt/old/g") == files.identity("/opt/old/g")
    assert again.listing("/usr/lib") == files.listing("/usr/lib")


def test_links_on_the_way_and_at_the_end_resolve_alike_for_every_path_of_a_directory(tmp_path):
    """Each directory is walked once for all its paths (image_files.resolve): what a path gives must not
    depend on which path of its directory was asked first."""
    diff_id, tar = layer(tmp_path, "d", [
        ("real", "dir"), ("real/f", "file"), ("real/up", "link", "../real"), ("here", "link", "real"),
        ("last", "link", "real/f"), ("loop1", "link", "loop2"), ("loop2", "link", "loop1")])
    files = ImageFiles([(diff_id, tar)], tmp_path / "listings")
    asked = ["/here/f", "/here/up/f", "/here/../real/f", "/last", "/loop1/f", "/loop1"]
    first = {(path, follow): files.resolve(path, follow) for path in asked for follow in (True, False)}
    again = ImageFiles([(diff_id, tar)], tmp_path / "listings")
    for path, follow in reversed(list(first)):
        assert again.resolve(path, follow) == first[(path, follow)], (path, follow)
    assert first[("/here/up/f", True)] == ("/real/f", [f"/here->real@{diff_id}", f"/real/up->../real@{diff_id}"])
    assert first[("/last", False)] == ("/last", [])
    assert first[("/last", True)] == ("/real/f", [f"/last->real/f@{diff_id}"])
    assert files.identity("/loop1/f").count("->") == 41  # the kernel's limit, then it gives up


def test_a_small_layers_file_is_named_by_its_bytes_and_a_big_layers_by_the_layer(tmp_path, monkeypatch):
    """A layer that gives one file anew beside unchanged ones (the in-image tools) changes only that
    file's identity; past the digest limit (a wheel group) the layer names its files."""
    tools = layer(tmp_path, "t", [("opt", "dir"), ("opt/a.py", "file", b"a"), ("opt/b.py", "file", b"b")])
    changed = layer(tmp_path, "u", [("opt", "dir"), ("opt/a.py", "file", b"a"), ("opt/b.py", "file", b"B")])
    before, after = (ImageFiles([found], tmp_path / "listings") for found in (tools, changed))
    assert before.identity("/opt/a.py") == after.identity("/opt/a.py")
    assert before.identity("/opt/b.py") != after.identity("/opt/b.py")
    assert before.identity("/opt/a.py") != before.identity("/opt/b.py")
    # kept beside the listing: a view whose tar is gone names the file alike
    tools[1].unlink()
    assert ImageFiles([(tools[0], tools[1])], tmp_path / "listings").identity("/opt/a.py") == before.identity("/opt/a.py")
    monkeypatch.setattr(layer_listing, "DIGESTED_LAYER_LIMIT", 1024)
    big = layer(tmp_path, "v", [("opt", "dir"), ("opt/a.py", "file", b"a" * 4096)])
    assert ImageFiles([big], tmp_path / "listings").identity("/opt/a.py") == f"file@{big[0]}"


# -- when a kept result stands ----------------------------------------------------------------------

PASSED = [smoke_report.passed("versions.torch", "torch 2.9.1")]


def test_a_kept_result_stands_only_while_its_reads_are_the_same(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    reads = Reads(frozenset({("read", "/lib/libx.so"), ("list", "/usr/lib"),
                             ("field", '/opt/stack.json\t["cuda"]')}), True)
    kept = KeyedResults(tmp_path / "kept")
    kept.record("versions", "sha256:one", identities(reads, files, "settings"), PASSED)
    hit = kept.reusable("versions", files, "settings")
    assert results_of(hit) == PASSED and hit["image"] == "sha256:one"
    assert kept.reusable("versions", files, "other settings") is None
    assert kept.reusable("imports", files, "settings") is None

    # another layer giving a file it read, a name more in a directory it listed, another field value
    for changed in ([("usr", "dir"), ("usr/lib", "dir"), ("usr/lib/libx.so", "file", b"y")],
                    [("usr", "dir"), ("usr/lib", "dir"), ("usr/lib/libz.so", "file")],
                    [("opt", "dir"), ("opt/stack.json", "file", json.dumps({"schema": 2, "cuda": "13"}).encode())]):
        other = ImageFiles([*three_layers, layer(tmp_path, "d", changed)], tmp_path / f"listings-{len(changed)}")
        assert kept.reusable("versions", other, "settings") is None, changed
    # a field it did not read changed, and a file it did not read: the result stands
    unread = layer(tmp_path, "e", [("opt", "dir"), ("opt/other", "file"), ("opt/stack.json", "file",
                                   json.dumps({"schema": 2, "cuda": "12", "bench": 1}).encode())])
    assert kept.reusable("versions", ImageFiles([*three_layers, unread], tmp_path / "le"), "settings") is not None
    # a later layer giving a file it read again, the same bytes: the result stands
    same = layer(tmp_path, "g", [("usr", "dir"), ("usr/lib", "dir"), ("usr/lib/libx.so", "file", b"x")])
    assert kept.reusable("versions", ImageFiles([*three_layers, same], tmp_path / "lg"), "settings") is not None


def test_failures_incomplete_traces_and_other_programs_are_never_taken_on_trust(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    kept = KeyedResults(tmp_path / "kept")
    failing = [smoke_report.failed("abi.cxx11", "mismatch")]
    kept.record("abi", "sha256:one", identities(Reads(frozenset({("read", "/lib/libx.so")}), True), files, "s"),
                failing)
    assert kept.reusable("abi", files, "s") is None
    # a check that ran another program stands only for the very same layers
    whole = identities(Reads(frozenset({("any", "nvcc")}), True), files, "s")
    kept.record("compile", "sha256:one", whole, PASSED)
    assert kept.reusable("compile", files, "s") is not None
    unrelated = layer(tmp_path, "f", [("srv", "dir")])
    assert kept.reusable("compile", ImageFiles([*three_layers, unrelated], tmp_path / "lf"), "s") is None
    incomplete = identities(Reads(frozenset(), False), files, "s")
    assert incomplete["image"] == ",".join(files.diff_ids)


def test_a_damaged_record_is_no_record(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    kept = KeyedResults(tmp_path / "kept")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "versions.json").write_text("{not json")
    assert kept.reusable("versions", files, "s") is None
    kept.record("versions", "sha256:one", {"settings": "s"}, PASSED)
    assert json.loads((tmp_path / "kept" / "versions.json").read_text())["format"] == 1


def test_what_the_checks_own_run_made_or_the_kernel_serves_is_no_read(tmp_path, three_layers):
    """A temporary file's random name or /proc/<pid> would make every run's record differ."""
    files = ImageFiles(three_layers, tmp_path / "listings")
    reads = Reads(frozenset({("read", "/tmp/tmpk2j1x9/a.so"), ("stat", "/tmp/tmpk2j1x9"), ("read", "/proc/17/maps"),
                             ("list", "/proc/self/fd"), ("read", "/dev/null"), ("stat", "/run/.containerenv"),
                             ("read", "/usr/lib/libx.so"), ("list", "/tmp")}), True)
    known = identities(reads, files, "s")
    assert set(known) == {"settings", "read\t/usr/lib/libx.so", "list\t/tmp"}
    # a scratch path the image itself holds is the image's: a read like any other
    holding = ImageFiles([*three_layers, layer(tmp_path, "g", [("tmp", "dir"), ("tmp/seed", "file", b"1")])],
                         tmp_path / "listings-g")
    assert "read\t/tmp/seed" in identities(Reads(frozenset({("read", "/tmp/seed")}), True), holding, "s")


def test_committed_runs_answer_a_host_that_kept_none_and_the_hosts_own_come_first(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    reads = Reads(frozenset({("read", "/lib/libx.so"), ("list", "/usr/lib")}), True)
    built_here = KeyedResults(tmp_path / "builder-host")
    answers = {"versions": built_here.record("versions", "sha256:one", identities(reads, files, "s"), PASSED),
               "abi": built_here.record("abi", "sha256:one", identities(reads, files, "s"), PASSED)}
    committed = keyed_results.committed_path(tmp_path / "reports", "row")
    committed.parent.mkdir()
    keyed_results.write_committed(committed, answers)
    first = committed.read_bytes()
    keyed_results.write_committed(committed, dict(reversed(list(answers.items()))))
    assert committed.read_bytes() == first  # the same answers, the same bytes

    clone = KeyedResults(tmp_path / "fresh-host", committed)
    assert results_of(clone.reusable("versions", files, "s")) == PASSED
    assert clone.reusable("imports", files, "s") is None
    changed = ImageFiles([*three_layers, layer(tmp_path, "h", [("usr", "dir"), ("usr/lib", "dir"),
                                                               ("usr/lib/libx.so", "file", b"y")])], tmp_path / "lh")
    assert clone.reusable("versions", changed, "s") is None
    # the host's own run first; recording keeps the committed one out of the host's file
    clone.record("versions", "sha256:two", identities(reads, changed, "s"), PASSED)
    assert clone.reusable("versions", changed, "s")["image"] == "sha256:two"
    assert clone.reusable("versions", files, "s")["image"] == "sha256:one"
    own = json.loads((tmp_path / "fresh-host" / "versions.json").read_text())["records"]
    assert [record["image"] for record in own] == ["sha256:two"]


def test_a_damaged_or_uncompressed_committed_file_answers_nothing(tmp_path, three_layers):
    files = ImageFiles(three_layers, tmp_path / "listings")
    committed = tmp_path / "row.smoke-reads.json.gz"
    for content in (b"\x1f\x8b\x08broken", json.dumps({"format": 1, "checks": {}}).encode(), b""):
        committed.write_bytes(content)
        assert KeyedResults(tmp_path / "kept", committed).reusable("versions", files, "s") is None
    assert KeyedResults(tmp_path / "kept", tmp_path / "absent.gz").reusable("versions", files, "s") is None


# -- the gate on a real image the builder wrote -----------------------------------------------------

KEYED_STACK = {"schema": 2, "stack": "smoke-keyed-test", "cuda": "13.0.1", "python": "3.11", "replaces": None,
               "driver": {"cuda": "13.0.1", "minimum": "580.82.07", "source": "NVIDIA CUDA Toolkit release notes"},
               "target_arch": ["12.0"], "venv": "/opt/venv", "distributions": {},
               "patches": [], "serve": {"env": {}, "cache_dir": "/cache", "modes": {}},
               "bench": {"input_len": 1, "output_len": 1, "num_prompts": 1, "regression_tolerance": 0.05},
               "overrides": [], "jit_device_code": {}}


def _keyed_image(engine, context: Path, tag: str, stack: dict, extra: str) -> str:
    from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

    from builder.engine.protocol import BuildRequest

    if not (context / "runtime").is_dir():
        import shutil
        shutil.copytree(REPO / "builder" / "runtime", context / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    write_context(context, (
        f"FROM {TEST_BASE_TAG}\n"
        "ARG SOURCE_DATE_EPOCH\n"
        'RUN ["/bin/sh", "-c", "mkdir -p /opt/venv/bin && ln -s /usr/bin/python3 /opt/venv/bin/python"]\n'
        "COPY runtime/ /opt/builder/runtime/\n"
        "COPY stack.json /opt/builder/stack.json\n"
        "COPY extra.txt /opt/extra.txt\n"
        "USER 1001:1001\n"), {"stack.json": json.dumps(stack), "extra.txt": extra})
    return engine.build(BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,),
                                     source_date_epoch=EPOCH, build_args={"SOURCE_DATE_EPOCH": str(EPOCH)},
                                     network="none")).image_id


@pytest.mark.engine
def test_the_gate_runs_a_check_again_only_when_something_it_read_changed(base_image, tmp_path, monkeypatch):
    """The smoke program in a small image the builder wrote: every check runs once; on the same image none
    runs; a file nothing read changes none; a field of the stack description runs the checks that read
    it; --resmoke runs them all. The report is the whole program's every time, in its order."""
    from builder.engine.buildah import BuildahEngine
    from builder.runtime.smoke.program import CHECKS
    from builder.smoke import keyed_gate

    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    engine = BuildahEngine(export_to_docker=False)
    tag, context = "localhost/smoke-keyed-test:1", tmp_path / "ctx"
    kept = KeyedResults(tmp_path / "kept")

    def gate(image_id: str, resmoke: bool = False, records: KeyedResults = kept) -> keyed_gate.GateOutcome:
        files = ImageFiles(engine.layer_tars(tag), tmp_path / "listings")
        engine.ensure_in_storage(tag)  # written into the layout: the checks' containers need it stored
        with engine.container_api() as api:
            return keyed_gate.run(tag, image_id, "smoke-keyed-test", files, engine.inspect(tag).config, records,
                                  api.client, {}, resmoke)

    try:
        first_id = _keyed_image(engine, context, tag, KEYED_STACK, "one")
        first = gate(first_id)
        assert first.ran == tuple(CHECKS) and not first.reused
        checks = [result.check for result in first.report.results]
        failing = {result.group for result in first.report.results if result.status == smoke_report.FAIL}
        assert "versions" in failing  # no torch here: a failure is never kept
        passing = [check for check in CHECKS if check not in failing]
        assert "patches" in passing and "gpu" in passing

        again = gate(first_id)
        assert sorted(again.reused) == sorted(passing) and set(again.ran) == failing
        assert [result.check for result in again.report.results] == checks
        assert again.report.results == first.report.results

        # a clone with nothing kept, answered by the committed runs
        committed = tmp_path / "smoke-keyed-test.smoke-reads.json.gz"
        keyed_results.write_committed(committed, {check: again.answers[check] for check in passing})
        clone = gate(first_id, records=KeyedResults(tmp_path / "clone-host", committed))
        assert sorted(clone.reused) == sorted(passing) and set(clone.ran) == failing

        unread_id = _keyed_image(engine, context, tag, KEYED_STACK, "two")  # /opt/extra.txt: nobody reads it
        assert unread_id != first_id
        assert sorted(gate(unread_id).reused) == sorted(passing)

        # target_arch: the arch check reads it; without a GPU the gpu check never gets to it, and without
        # a compiler pinned neither does compile; the patches check reads only `patches`
        field_id = _keyed_image(engine, context, tag, dict(KEYED_STACK, target_arch=["9.0"]), "two")
        by_field = gate(field_id)
        assert "arch" in by_field.ran and "versions" in by_field.ran
        assert {"patches", "gpu", "compile", "imports", "entrypoint"} <= set(by_field.reused)
        assert {result.check for result in by_field.report.results} == set(checks)

        assert gate(field_id, resmoke=True).ran == tuple(CHECKS)
    finally:
        engine.remove(tag)


def test_a_part_of_the_stack_description_is_told_by_its_value(tmp_path):
    def image(name: str, patches: list) -> ImageFiles:
        document = json.dumps({"schema": 2, "patches": patches}).encode()
        return ImageFiles([layer(tmp_path, name, [("opt", "dir"), ("opt/stack.json", "file", document)])],
                          tmp_path / f"listings-{name}")

    read_files = Reads(frozenset({("field", '/opt/stack.json\t["patches", "#length"]'),
                                  ("field", '/opt/stack.json\t["patches", 0, "files"]')}), True)
    kept = KeyedResults(tmp_path / "kept")
    kept.record("imports", "sha256:one", identities(read_files, image("a", [{"files": ["a.py"], "sha256": "1"}]), "s"),
                PASSED)
    assert kept.reusable("imports", image("b", [{"files": ["a.py"], "sha256": "2"}]), "s") is not None
    assert kept.reusable("imports", image("c", [{"files": ["b.py"], "sha256": "1"}]), "s") is None
    assert kept.reusable("imports", image("d", [{"files": ["a.py"], "sha256": "1"}, {"files": []}]), "s") is None
    assert kept.reusable("imports", image("e", []), "s") is None
