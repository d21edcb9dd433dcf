"""The write-once build (builder/engine/write_once.py): the Dockerfile read as a plan, each step's
changes written once as a canonical layer, and the image the same, by id, as the engine's image of
the same Dockerfile in canonical form."""

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, engine_image, write_context

from builder.engine import write_once
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure, UserError
from builder.files import TEMP_SUFFIX
from builder.oci import dockerfile_plan, layer_listing, tree_layer
from builder.oci.layer_diff import discard_storage
from builder.oci.layout import Layout

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("stack", ["sglang-0.5.9-cu128-local", "sglang-0.5.23-cu130-local"])
def test_the_plan_writes_the_history_buildah_wrote_for_the_built_rows(stack):
    """Every history entry the engine wrote for a locked image (its build report, canonical form)."""
    report = json.loads((REPO / "build-reports" / f"{stack}.json").read_text())
    plan = dockerfile_plan.parse((REPO / "images" / stack / "Dockerfile").read_text(),
                                 {"SOURCE_DATE_EPOCH": str(report["source_date_epoch"])})
    engine_history = [entry["created_by"] for entry in report["config"]["history"][1:]]
    assert [step.created_by for step in plan.steps] == engine_history
    layer_steps = [step.created_by for step in plan.steps if not step.empty_layer]
    assert layer_steps == [layer["step"] for layer in report["layers"][1:]]


def test_the_plan_names_the_build_arguments_as_buildah_does():
    """What buildah 1.28.2 wrote for this Dockerfile (with --build-arg SOURCE_DATE_EPOCH=1735689600): an
    ARG entry names the arguments with a value so far, sorted; a RUN step's prefix sorts the NAME=VALUE
    strings ("A1=x" before "A=y"); an argument with no value is named nowhere and sets no variable."""
    plan = dockerfile_plan.parse('FROM base:1\nARG SOURCE_DATE_EPOCH\nARG NOVAL\nARG A=y\nARG A1=x\nRUN ["true"]\n',
                                 {"SOURCE_DATE_EPOCH": "1735689600"})
    assert [step.created_by for step in plan.steps] == [
        "/bin/sh -c #(nop) ARG SOURCE_DATE_EPOCH",
        "/bin/sh -c #(nop) ARG SOURCE_DATE_EPOCH",
        "/bin/sh -c #(nop) ARG A SOURCE_DATE_EPOCH",
        "/bin/sh -c #(nop) ARG A A1 SOURCE_DATE_EPOCH",
        '|3 A1=x A=y SOURCE_DATE_EPOCH=1735689600 /bin/sh -c ["true"]',
    ]
    assert plan.build_args == {"SOURCE_DATE_EPOCH": "1735689600", "A": "y", "A1": "x"}


@pytest.mark.parametrize("text, problem", [
    ("RUN echo hi\n", "exec form"),
    ("ADD x /x\n", "does not run 'ADD'"),
    ("COPY --chown=1:1 a /a\n", "no options"),
    ("COPY ../a /a\n", "not a path inside the context"),
    ("COPY a b\n", "must be absolute"),
    ('RUN --mount=type=cache,target=/c ["/bin/true"]\n', "read-only bind mount"),
    ('RUN --mount=type=bind,source=w,target=/w ["/bin/true"]\n', "read-only bind mount"),
    ("ENV novalue\n", "key=value"),
    ("USER a b\n", "one value"),
    ('CMD ["a", 1]\n', "exec form"),
    ("ENV A=1 \\\n", "continuation"),
])
def test_the_plan_refuses_what_the_templates_never_write_by_its_line(text, problem):
    with pytest.raises(BuildFailure, match=problem) as raised:
        dockerfile_plan.parse(f"FROM base:1\n# a comment\n{text}", {})
    assert "Dockerfile:3" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_plan_must_start_from_a_base():
    with pytest.raises(BuildFailure, match="first instruction must be FROM"):
        dockerfile_plan.parse("RUN [\"/bin/true\"]\n", {})


def _entries(layout: Layout, diff_id: str) -> list[tuple]:
    with layout.open_blob(diff_id, verify=True) as blob, tarfile.open(fileobj=blob, mode="r|") as tar:
        return [(m.name, m.type, m.mode, m.uid, m.mtime, m.size, m.linkname) for m in tar]


def test_a_step_layer_holds_what_changed_its_parents_and_whiteouts(tmp_path):
    root, scratch = tmp_path / "root", tmp_path / "scratch"
    for directory in ("etc", "usr/share/doc/a", "opt/kept"):
        (root / directory).mkdir(parents=True)
    (root / "etc" / "issue").write_text("old")
    (root / "opt" / "kept" / "same").write_text("unchanged")
    (root / "usr" / "share" / "doc" / "a" / "x").write_text("x")
    scratch.mkdir()
    before = tree_layer.snapshot(root)
    since = tree_layer.mark(scratch)
    (root / "etc" / "issue").unlink()
    (root / "usr" / "share" / "doc" / "a" / "x").unlink()
    (root / "usr" / "share" / "doc" / "a").rmdir()
    (root / "opt" / "kept" / "new").write_text("new")
    os.chmod(root / "opt" / "kept" / "new", 0o750)
    os.link(root / "opt" / "kept" / "new", root / "opt" / "kept" / "new2")
    os.symlink("new", root / "opt" / "kept" / "to-new")
    (root / "etc" / "hostname").write_text("")  # an engine's mount point: never in a RUN layer
    layout = Layout.create(tmp_path / "layout")
    layer, after = tree_layer.write_step_layer(layout, root, root, since, before, EPOCH, drop_stubs=True)
    entries = _entries(layout, layer.diff_id)
    assert [(name, kind) for name, kind, *_ in entries] == [
        ("etc", tarfile.DIRTYPE), ("etc/.wh.issue", tarfile.REGTYPE),
        ("opt", tarfile.DIRTYPE), ("opt/kept", tarfile.DIRTYPE), ("opt/kept/new", tarfile.REGTYPE),
        ("opt/kept/new2", tarfile.LNKTYPE), ("opt/kept/to-new", tarfile.SYMTYPE),
        ("usr", tarfile.DIRTYPE), ("usr/share", tarfile.DIRTYPE), ("usr/share/doc", tarfile.DIRTYPE),
        ("usr/share/doc/.wh.a", tarfile.REGTYPE),
    ]
    by_name = {entry[0]: entry for entry in entries}
    assert by_name["opt/kept/new"][2] == 0o750 and by_name["opt/kept/new"][5] == 3
    assert by_name["opt/kept/new2"][6] == "opt/kept/new"
    assert by_name["opt/kept/to-new"][6] == "new"
    assert by_name["etc/.wh.issue"][2] == 0
    assert {entry[4] for entry in entries} == {EPOCH}
    assert "opt/kept/same" not in by_name and "etc/hostname" not in after.paths
    assert layer.size == layout.blob_path(layer.diff_id).stat().st_size
    # The listing kept as written is the one a reader of the tar would make.
    with tarfile.open(layout.blob_path(layer.diff_id), "r:") as tar:
        assert list(layer.listing) == layer_listing.rows_of(tar)
    assert ("/opt/kept/new2", "hardlink", "/opt/kept/new") in layer.listing


def test_a_directory_made_again_is_opaque_and_a_copied_up_one_is_not(tmp_path):
    root, scratch = tmp_path / "root", tmp_path / "scratch"
    (root / "base-dir").mkdir(parents=True)
    (root / "base-dir" / "old").write_text("old")
    scratch.mkdir()
    started = tree_layer.mark(scratch)
    (root / "made").mkdir()
    for name in ("a", "b"):
        (root / "made" / name).write_text(name)
    before = tree_layer.snapshot(root)
    since = tree_layer.mark(scratch)
    for name in ("a", "b"):
        (root / "made" / name).unlink()
    (root / "made").rmdir()
    (root / "made").mkdir()  # ext4 may hand back the same inode number
    (root / "made" / "b").write_text("new")
    (root / "made" / "sub").mkdir()  # below an opaque directory: new, not opaque
    (root / "base-dir" / "added").write_text("added")
    layer, _ = tree_layer.write_step_layer(Layout.create(tmp_path / "layout"), root, root, since, before, EPOCH,
                                           drop_stubs=False, build_started_ns=started)
    names = [entry[0] for entry in _entries(Layout(tmp_path / "layout"), layer.diff_id)]
    assert names == ["base-dir", "base-dir/added", "made", "made/.wh..wh..opq", "made/b", "made/sub"]


def test_the_same_tree_change_gives_the_same_layer_bytes(tmp_path):
    digests = []
    for run in ("one", "two"):
        root = tmp_path / run / "root"
        (root / "a").mkdir(parents=True)
        before = tree_layer.snapshot(root)
        since = tree_layer.mark(tmp_path / run)
        for name in ("b", "a/c", "a/b-c"):
            (root / name).write_text(name)
        layer, _ = tree_layer.write_step_layer(Layout.create(tmp_path / run / "layout"), root, root, since, before, EPOCH,
                                               drop_stubs=False)
        digests.append(layer.diff_id)
    assert digests[0] == digests[1]


def test_a_copy_layer_read_from_its_destination_is_the_whole_walks_layer(tmp_path):
    """A COPY writes only at its destination, so its layer is read from there and its parents; the
    layer and the tree's paths after it are what reading the whole tree gives. A link on the way to
    the destination makes it read the whole tree (the path would lead elsewhere on the host)."""
    results = []
    for run, under in (("whole", None), ("under", "opt/builder/runtime"), ("linked", "opt/link/runtime")):
        root = tmp_path / run / "root"
        for directory in ("etc", "opt/builder/runtime", "usr/lib"):
            (root / directory).mkdir(parents=True)
        (root / "opt" / "link").symlink_to("builder")
        (root / "opt" / "builder" / "runtime" / "old.py").write_text("old")
        (root / "usr" / "lib" / "x").write_text("x")
        before = tree_layer.snapshot(root)
        since = tree_layer.mark(tmp_path / run)
        (root / "opt" / "builder" / "runtime" / "tool.py").write_text("tool")
        (root / "opt" / "builder" / "runtime" / "sub").mkdir()
        (root / "opt" / "builder" / "runtime" / "sub" / "a.py").write_text("a")
        (root / "opt" / "builder" / "runtime" / "old.py").unlink()
        layer, after = tree_layer.write_step_layer(Layout.create(tmp_path / run / "layout"), root, root, since, before,
                                                   EPOCH, drop_stubs=False, under=under)
        results.append((layer.diff_id, after.paths, after.directories.keys()))
    assert results[0] == results[1] == results[2]
    assert "usr/lib/x" in results[1][1] and "opt/builder/runtime/old.py" not in results[1][1]


@pytest.mark.engine
def test_the_import_gives_buildah_the_staging_directory(tmp_path, monkeypatch):
    """buildah pull stages each blob under $TMPDIR before it applies it: the import hands it the staging
    environment (staging.py), shown here with a directory that does not exist, which buildah refuses."""
    import contextlib
    import hashlib
    import io

    from builder.engine import staging

    data = b"staged\n"
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("staged.txt")
        info.size, info.mtime = len(data), EPOCH
        tar.addfile(info, io.BytesIO(data))
    store = Layout.create(tmp_path / "layout")
    layer = store.write_blob(tar_bytes.getvalue())
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [layer.digest]}}, sort_keys=True).encode()
    layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer.digest, "size": layer.size}]
    asked = []

    @contextlib.contextmanager
    def nowhere(need_bytes, memory_fs=None):
        asked.append(need_bytes)
        yield {**os.environ, "TMPDIR": str(tmp_path / "no-such-directory")}

    monkeypatch.setattr(staging, "staging_environment", nowhere)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with pytest.raises(BuildFailure, match="no-such-directory"):
        write_once.import_image(["buildah"], store, config, layers, workdir, "localhost/staging-probe:1")
    with pytest.raises(BuildFailure, match="no-such-directory"):
        write_once.import_image(["buildah"], store, config, layers, workdir, "localhost/staging-probe:1",
                                stored={layer.digest})
    assert asked == [layer.size, 0]  # a layer the storage holds is not counted as staged
    monkeypatch.undo()
    try:
        assert write_once.import_image(["buildah"], store, config, layers, workdir,
                                       "localhost/staging-probe:1") == "sha256:" + hashlib.sha256(config).hexdigest()
    finally:
        subprocess.run(["buildah", "rmi", "localhost/staging-probe:1"], capture_output=True)


TINY = f"""FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
COPY data/a.txt /opt/t/a.txt
RUN --mount=type=bind,source=data,target=/run/data,ro \\
    ["/bin/sh", "-c", "mkdir -p /opt/x && cat /run/data/a.txt > /opt/x/y && ln /opt/x/y /opt/x/z && ln -s y /opt/x/s && chown 1001:1001 /opt/x/z && rm -f /etc/issue.net && rm -r /usr/share/doc/bash"]
ENV FOO=bar \\
    PATH=/opt/bin:/usr/bin:/bin
COPY data/ /opt/data/
RUN ["/bin/sh", "-c", "rm -rf /opt/data && mkdir -p /opt/data/sub && cp /opt/t/a.txt /opt/data/ && rm /etc/issue"]
COPY data/a.txt data/run.sh late.txt /opt/multi/
WORKDIR /opt/data
USER 1001:1001
RUN ["/bin/sh", "-c", "id -u > /tmp/who && pwd >> /tmp/who && echo $FOO $SOURCE_DATE_EPOCH >> /tmp/who"]
EXPOSE 30000
ENTRYPOINT ["/bin/cat"]
CMD ["/tmp/who"]
LABEL a.b="x y" \\
      c="d"
"""


def _tiny_request(tmp_path: Path, tag: str, no_cache: bool = False) -> BuildRequest:
    context = tmp_path / "ctx"
    if not context.is_dir():
        write_context(context, TINY)
        (context / "data").mkdir()
        (context / "data" / "a.txt").write_text("hello\n")
        (context / "data" / "run.sh").write_text("#!/bin/sh\n")
        (context / "late.txt").write_text("read after two RUN steps\n")
        os.chmod(context / "data" / "a.txt", 0o640)
        os.chmod(context / "data" / "run.sh", 0o755)
    return BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=(tag,),
                        source_date_epoch=EPOCH, build_args={"SOURCE_DATE_EPOCH": str(EPOCH)}, network="none",
                        # buildah 1.28's layer cache ignores --timestamp: a layer cached by another
                        # test's epoch would be reused with that epoch's times.
                        no_cache=no_cache)


def _runs(tag: str) -> str:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    pid_max = Path("/proc/sys/kernel/pid_max").read_text().strip()
    ran = subprocess.run(["podman", "run", "--rm", "--network", "none", "--ulimit", f"nofile={nofile}",
                          "--ulimit", f"nproc={pid_max}", tag], capture_output=True, text=True)
    return ran.stdout + ran.stderr


@pytest.mark.engine
def test_the_written_image_is_the_engines_image_by_id_and_its_cache_is_keyed_by_inputs(base_image, tmp_path,
                                                                                      monkeypatch):
    """The same Dockerfile, built by buildah and put in canonical form, and written by the builder
    step by step: one image id, and the written image runs. The steps cover a file, a directory and
    several files copied, a bind mount, a hard and a symbolic link, an owner, whiteouts (two in one
    layer), a directory removed and made again (opaque), ENV, WORKDIR, USER and the exec-form configs.
    Written again, every layer comes from the cache and nothing runs; with one copied file changed,
    the layers from its first reader on are written again, and the image is still the engine's."""
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    engine = BuildahEngine(export_to_docker=False)
    built_tag, written_tag = "localhost/write-once-engine:1", "localhost/write-once-written:1"
    try:
        built = engine_image(engine, _tiny_request(tmp_path, built_tag, no_cache=True))
        written = engine.build(_tiny_request(tmp_path, written_tag))
        assert written.image_id == built.image_id
        assert [layer.diff_id for layer in written.layers] == [layer.diff_id for layer in built.layers]
        assert (written.written_layers, written.reused_layers) == (6, 0)
        engine.ensure_in_storage(written_tag)
        assert _runs(written_tag) == f"1001\n/opt/data\nbar {EPOCH}\n"
        store = Layout(tmp_path / "cache" / "write-once" / "layout")
        assert all(store.has_blob(layer.diff_id) for layer in written.layers)
        # Each written layer's listing is kept as written: the smoke gate reads no tar for it.
        kept = tmp_path / "cache" / "layer-listings"
        assert all((kept / f"{layer.diff_id.removeprefix('sha256:')}.json").is_file() for layer in written.layers[-6:])

        again = engine.build(_tiny_request(tmp_path, written_tag))
        assert (again.image_id, again.written_layers, again.reused_layers) == (written.image_id, 0, 6)

        # data/run.sh is first read by the RUN that mounts data/: that step and every one after it run
        # again; the first COPY (data/a.txt alone) is reused.
        (tmp_path / "ctx" / "data" / "run.sh").write_text("#!/bin/sh\necho changed\n")
        changed = engine.build(_tiny_request(tmp_path, written_tag))
        assert (changed.written_layers, changed.reused_layers) == (5, 1)
        rebuilt = engine_image(engine, _tiny_request(tmp_path, built_tag, no_cache=True))
        assert changed.image_id == rebuilt.image_id != written.image_id
        engine.ensure_in_storage(written_tag)
        assert _runs(written_tag) == f"1001\n/opt/data\nbar {EPOCH}\n"

        # late.txt is first read after two RUN steps: the working container starts on a cached prefix
        # whose layers left the engine's mount-point stubs out, and the last RUN's layer is still the
        # engine's (it gains no /etc).
        (tmp_path / "ctx" / "late.txt").write_text("changed\n")
        late = engine.build(_tiny_request(tmp_path, written_tag))
        assert (late.written_layers, late.reused_layers) == (2, 4)
        rebuilt = engine_image(engine, _tiny_request(tmp_path, built_tag, no_cache=True))
        assert [layer.diff_id for layer in late.layers] == [layer.diff_id for layer in rebuilt.layers]
        assert late.image_id == rebuilt.image_id
    finally:
        engine.remove(written_tag)
    assert list((tmp_path / "cache" / "write-once" / "tmp").iterdir()) == []  # no root, bundle or layout is left
    assert str(tmp_path) not in Path("/proc/mounts").read_text()


@pytest.mark.parametrize("change, problem", [
    ({"labels": {"a": "b"}}, "labels"),
    ({"add_hosts": ("h:127.0.0.1",)}, "add_hosts"),
    ({"network": "host"}, "network host"),
])
def test_the_write_once_build_refuses_requests_it_cannot_honour(tmp_path, change, problem):
    request = _tiny_request(tmp_path, "localhost/write-once-refused:1")
    engine = BuildahEngine(export_to_docker=False)
    with pytest.raises(UserError, match=problem):
        engine.build(dataclasses.replace(request, **change))


KILLED = f"""FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
COPY data/a.txt /opt/t/a.txt
RUN ["/bin/sh", "-c", "echo step-started && sleep 4 && echo done > /opt/t/done"]
COPY data/run.sh /opt/t/run.sh
"""

_WRITE = """
import sys
from builder.engine.buildah import BuildahEngine
from builder.engine.protocol import BuildRequest
request = BuildRequest(context_dir=sys.argv[1], dockerfile=sys.argv[1] + "/Dockerfile", tags=(sys.argv[2],),
                       source_date_epoch=int(sys.argv[3]), build_args={"SOURCE_DATE_EPOCH": sys.argv[3]},
                       network="none", progress=lambda line: print(line, flush=True))
print(BuildahEngine(export_to_docker=False).build(request).image_id, flush=True)
"""


@pytest.mark.engine
def test_a_write_once_build_killed_in_a_step_moves_no_tag_and_leaves_no_lying_blob(base_image, tmp_path,
                                                                                    monkeypatch):
    """SIGKILL while a container step runs: the tag stays where it was, every blob in the store is what
    its name says, and the next build sweeps the dead build's container and gives the engine's id."""
    context = write_context(tmp_path / "ctx", KILLED, {"data": ""})
    (context / "data").unlink()
    (context / "data").mkdir()
    (context / "data" / "a.txt").write_text("a\n")
    (context / "data" / "run.sh").write_text("b\n")
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))  # the engine here reads the build's layout
    env = {**os.environ}
    tag = "localhost/write-once-killed:1"
    engine = BuildahEngine(export_to_docker=False)
    engine.tag(TEST_BASE_TAG, tag)
    argv = [sys.executable, "-c", _WRITE, str(context), tag, str(EPOCH)]
    try:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        for line in process.stdout:
            if "step-started" in line:
                break
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert engine.image_id(tag) == engine.image_id(TEST_BASE_TAG)
        store = Layout(tmp_path / "cache" / "write-once" / "layout")
        for blob in store.blobs.iterdir():
            if not blob.name.startswith("."):
                assert store.read_blob(f"sha256:{blob.name}", verify=True) is not None

        rerun = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
        # The written image's tag is the layout's ref, and the storage's name on the base went with it.
        assert subprocess.run(["buildah", "inspect", "--type", "image", tag], capture_output=True).returncode != 0
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "removed what a killed build left: " in rerun.stdout
        assert f"builder-step-{process.pid}-" in rerun.stdout  # its step, still running in the runtime
        written_id = rerun.stdout.strip().splitlines()[-1]
        built = engine_image(engine, BuildRequest(context_dir=context, dockerfile=context / "Dockerfile",
                                                  tags=("localhost/write-once-killed-engine:1",),
                                                  source_date_epoch=EPOCH, build_args={"SOURCE_DATE_EPOCH": str(EPOCH)},
                                                  network="none", no_cache=True))
        assert written_id == built.image_id == engine.image_id(tag)
        state = tmp_path / "cache" / "write-once" / "runtime"
        leftovers = subprocess.run(["runc", "--root", str(state), "list", "--quiet"], capture_output=True, text=True,
                                   check=True)
        assert leftovers.stdout.strip() == ""
        assert str(tmp_path) not in Path("/proc/mounts").read_text()
    finally:
        engine.remove(tag)


@pytest.mark.engine
@pytest.mark.network
def test_buildah_1_39_from_its_chroot_writes_the_same_image(base_image, trixie_buildah, tmp_path, monkeypatch):
    """Trixie's buildah, from its root (engine/chrooted.py), hands over the base and the builder runs the
    steps itself: the image id is bookworm's 1.28's, so the engine's version decides nothing the builder
    writes."""
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    engines = {name: BuildahEngine(storage_dir=tmp_path / f"storage-{name}", export_to_docker=False, command=command)
               for name, command in (("bookworm", ["buildah"]), ("trixie", trixie_buildah))}
    try:
        ids = {}
        for name, engine in engines.items():
            engine.load(base_image.archive)
            written = engine.build(_tiny_request(tmp_path, f"localhost/write-once-{name}:1"))
            assert (written.written_layers, written.reused_layers) == (6, 0)
            ids[name] = written.image_id
        assert engines["trixie"].version().startswith("1.39")
        assert ids["trixie"] == ids["bookworm"]
    finally:
        for engine in engines.values():
            discard_storage(engine, engine.storage_dir)


def test_the_wheel_groups_are_the_steps_written_from_their_plans():
    """The rendered install steps are the ones the builder writes from their plans, read through the
    step's bind mount on the host; every other step, and a path that leaves the mount, is run."""
    text = (REPO / "images" / "sglang-0.5.9-cu128-local" / "Dockerfile").read_text()
    plan = dockerfile_plan.parse(text, {"SOURCE_DATE_EPOCH": str(EPOCH)})
    context = Path("/ctx")
    found = [write_once._planned_install(step, context) for step in plan.steps]
    assert [f for f in found if f] == [(context / "wheels" / f"{group}.plan.json", context / "wheels")
                                       for group in ("torch", "kernels", "sglang")]
    install = next(step for step, f in zip(plan.steps, found) if f)
    escaping = dataclasses.replace(install, argv=(*install.argv[:5], "/run/wheels/../x.json", install.argv[6]))
    outside = dataclasses.replace(install, argv=(*install.argv[:5], "/opt/x.json", install.argv[6]))
    assert write_once._planned_install(escaping, context) is None
    assert write_once._planned_install(outside, context) is None


@pytest.mark.engine  # the sweep asks the OCI runtime for the dead builds' step containers
def test_a_build_beside_a_running_one_leaves_its_temporaries_and_the_next_build_alone_sweeps_them(tmp_path):
    root = tmp_path / "write-once"
    half_written = Layout.create(root / "layout").blobs / f".half-written{TEMP_SUFFIX}"
    with write_once.in_use(root):  # a running build (or import, or push) holds the store
        half_written.write_bytes(b"a blob on its way")
        with write_once.in_use(root, sweep=True) as swept:  # a second build starts at once, beside it
            assert swept == []
        assert half_written.exists()
    with write_once.in_use(root, sweep=True) as swept:  # alone now: what the first left is a leftover
        assert half_written.name in swept
    assert not half_written.exists()


@pytest.mark.engine
def test_two_builds_over_one_store_at_once_each_give_the_image_they_give_alone(base_image, tmp_path, monkeypatch):
    """Two builds (of contexts that differ in a file read late) started together over one store: both
    land, each with the id its build alone gives, and no scratch is left."""
    engine = BuildahEngine(export_to_docker=False)
    tags = ("localhost/write-once-side:1", "localhost/write-once-side:2")
    requests = [_tiny_request(tmp_path / name, tag) for name, tag in zip(("one", "two"), tags)]
    (tmp_path / "two" / "ctx" / "late.txt").write_text("the second context\n")
    try:
        monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "alone"))
        alone = [engine.build(request).image_id for request in requests]
        monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "shared"))
        with ThreadPoolExecutor(2) as together:
            side_by_side = [done.image_id for done in together.map(engine.build, requests)]
    finally:
        for tag in tags:
            engine.remove(tag)
    assert side_by_side == alone and alone[0] != alone[1]
    assert list((tmp_path / "shared" / "write-once" / "tmp").iterdir()) == []
