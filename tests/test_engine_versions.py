"""The engine's version does not decide the image: buildah 1.28.2 (the host's, Debian bookworm) and 1.39.3
(Debian trixie's, run from a root made with mmdebstrap) build one small image on the test base, each from
its own empty storage, and get one image id; the engines' own images differ (docs/engines.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine import chrooted, engine_root
from builder.engine.buildah import COMMAND_ENV, BuildahEngine, buildah_command
from builder.engine.canonical_export import CanonicalIndex
from builder.engine.protocol import BuildRequest
from builder.errors import UserError
from builder.oci import canonical
from builder.oci.layer_diff import compare, discard_storage, layer_entries, read_image

DOCKERFILE = f"""\
FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
ARG BUILD_NETWORK=none
RUN python3 -m venv /opt/venv
COPY hello.txt /opt/hello.txt
RUN --mount=type=bind,source=.,target=/run/context,ro cp /run/context/hello.txt /opt/mounted.txt
RUN mkdir -p /opt/x && echo hi > /opt/x/a && ln -s a /opt/x/b && ln /opt/x/a /opt/x/c && chmod 4755 /opt/x/a
LABEL dev.sglang-builder.test=engine-versions
WORKDIR /opt
ENV APP_HOME=/opt \\
    APP_MODE=test
EXPOSE 30000
ENTRYPOINT ["/bin/echo"]
CMD ["serve"]
RUN echo {{last}} > /opt/last.txt
"""


def request(tmp_path, last: str = "one", progress=None) -> BuildRequest:
    context = tmp_path / f"ctx-{last}"
    if not context.is_dir():  # written once: the bind mount's cache key sees the files' times
        write_context(context, DOCKERFILE.format(last=last), {"hello.txt": "hello\n"})
    return BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=("localhost/engine-versions:1",),
                        source_date_epoch=EPOCH, build_args={"SOURCE_DATE_EPOCH": str(EPOCH)}, network="none",
                        platform="linux/amd64", progress=progress)


def rewritten_from(lines: list[str]) -> list[str]:
    """Where the export read each layer it rewrote, from the build's progress lines."""
    return [line.rsplit(" from ", 1)[1].split(",")[0] for line in lines if line.startswith("canonical layer ")]


def stored_images(engine: BuildahEngine) -> set[str]:
    listed = subprocess.run([*engine._global_args(), "images", "--all", "--no-trunc", "--json"], capture_output=True,
                            text=True, check=True).stdout
    return {"sha256:" + image["id"].removeprefix("sha256:") for image in json.loads(listed or "[]")}


@pytest.fixture
def private_engine(tmp_path, base_image):
    made = []

    def make(name: str, command: list[str]) -> BuildahEngine:
        engine = BuildahEngine(storage_dir=tmp_path / f"storage-{name}", export_to_docker=False, command=command)
        made.append(engine)
        engine.load(base_image.archive)
        return engine

    yield make
    for engine in made:
        discard_storage(engine, engine.storage_dir)


@pytest.mark.engine
@pytest.mark.network
def test_buildah_1_28_and_1_39_build_one_image_id(private_engine, trixie_buildah, tmp_path):
    results = {}
    for name, command in (("bookworm", ["buildah"]), ("trixie", trixie_buildah)):
        engine = private_engine(name, command)
        lines: list[str] = []
        first = engine.build(request(tmp_path, progress=lines.append))
        # Every layer was read through the engine's own export, never from its storage's files.
        assert rewritten_from(lines) == ["buildah push"] * 5, lines
        # Imported a layer at a time: no image of a partial list of the canonical layers is left.
        layers = [layer.diff_id for layer in engine.inspect(first.image_id).layers]
        assert not [image for image in stored_images(engine)
                    if [layer.diff_id for layer in engine.inspect(image).layers] in
                    [layers[:cut] for cut in range(2, len(layers))]]
        # What verify --against-lock compares: the same id, computed without storing the canonical image.
        preview = engine.canonical_preview(first.native_id, request(tmp_path))
        stored = engine.inspect(first.image_id)
        assert preview.image_id == first.image_id and dict(preview.config) == dict(stored.config)
        assert [(l.diff_id, l.created_by) for l in preview.layers] == [(l.diff_id, l.created_by) for l in stored.layers]
        again = engine.build(request(tmp_path))  # the layer cache and the earlier export: nothing rewritten
        assert (again.image_id, again.native_id, again.canonical_layers) == (first.image_id, first.native_id, 0)
        engine.save(first.image_id, tmp_path / f"{name}.tar")
        results[name] = first
    old, new = results["bookworm"], results["trixie"]
    assert old.identity.version.startswith("1.28.") and new.identity.version.startswith("1.39.")
    assert old.native_id != new.native_id  # the engines' own images differ...
    assert old.image_id == new.image_id  # ...their canonical form does not
    assert old.canonical_layers == new.canonical_layers == 5  # every layer but the base's
    assert compare(tmp_path / "bookworm.tar", tmp_path / "trixie.tar").identical
    image = read_image(tmp_path / "trixie.tar")
    built_layers = [layer_entries(image, layer) for layer in image.layers[1:]]
    assert all("etc/hostname" not in entries for entries in built_layers)
    assert all(entry[1] <= 0o7777 for entries in built_layers for entry in entries.values())
    assert "opt/x/a" in built_layers[3] and built_layers[3]["opt/x/a"][1] == 0o4755


@pytest.mark.engine
def test_a_changed_step_rewrites_only_its_layer_and_a_lost_export_is_made_again(private_engine, tmp_path):
    engine = private_engine("host", ["buildah"])
    first = engine.build(request(tmp_path, "one"))
    changed = engine.build(request(tmp_path, "two"))
    assert changed.image_id != first.image_id
    assert changed.canonical_layers == 1 and 0 < changed.canonical_bytes < 20_000
    engine.remove("localhost/engine-versions:1")  # the only name of `changed`: its last layer goes with it
    assert not engine.exists(changed.image_id)
    # The index still names it; the export starts over and gives the same image.
    lines: list[str] = []
    again = engine.build(request(tmp_path, "two", progress=lines.append))
    assert again.image_id == changed.image_id and again.native_id == changed.native_id
    assert again.canonical_layers == 5 and rewritten_from(lines) == ["buildah push"] * 5
    # verify's preview looks up the layers an export recorded, and reads none of them again: the same id,
    # and a planted record for the top layer is what the preview then reports for it.
    index = CanonicalIndex(engine.storage_dir / "canonical-index")
    looked_up = engine.canonical_preview(changed.native_id, request(tmp_path, "two"), known=index)
    assert looked_up.image_id == changed.image_id
    top = engine.inspect(changed.native_id).layers[-1]
    assert "/opt/last.txt" in top.created_by
    planted = "sha256:" + "0" * 64
    index.record_layer(top.diff_id, canonical.is_run_step(top.created_by), planted, 1)
    assert engine.canonical_preview(changed.native_id, request(tmp_path, "two"), known=index).layers[-1].diff_id == planted


@pytest.mark.engine
def test_two_steps_that_make_one_layer_are_rewritten_once(private_engine, tmp_path):
    context = write_context(tmp_path / "ctx-repeat", f"FROM {TEST_BASE_TAG}\nCOPY a.txt /a.txt\nCOPY a.txt /a.txt\n"
                            "LABEL x=y\n", {"a.txt": "a\n"})
    repeated = BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=("localhost/engine-repeat:1",),
                            source_date_epoch=EPOCH, network="none", platform="linux/amd64")
    engine = private_engine("repeat", ["buildah"])
    built = engine.build(repeated)
    native = engine.inspect(built.native_id).layers
    assert native[1].diff_id == native[2].diff_id  # the same bytes: buildah stores them as one layer
    assert built.canonical_layers == 1
    canonical_layers = engine.inspect(built.image_id).layers
    assert len(canonical_layers) == 3 and canonical_layers[1].diff_id == canonical_layers[2].diff_id
    assert engine.canonical_preview(built.native_id, repeated).image_id == built.image_id


def test_builder_buildah_names_the_command_as_argument_words(monkeypatch):
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    assert buildah_command() == ["buildah"]
    monkeypatch.setenv(COMMAND_ENV, "python3 -m builder.engine.chrooted '/var/tmp/engine/a root' buildah")
    assert buildah_command() == ["python3", "-m", "builder.engine.chrooted", "/var/tmp/engine/a root", "buildah"]
    monkeypatch.setenv(COMMAND_ENV, "python3 'unclosed")
    with pytest.raises(UserError, match=r"^BUILDER_BUILDAH=.*: No closing quotation$"):
        buildah_command()
    monkeypatch.setenv(COMMAND_ENV, "/nonexistent/buildah")
    with pytest.raises(UserError, match=r"^/nonexistent/buildah not found \(BUILDER_BUILDAH=/nonexistent/buildah\)"):
        BuildahEngine(export_to_docker=False).check()


def test_the_engine_root_is_named_by_its_recipe(tmp_path):
    first = engine_root.root_path(tmp_path, "trixie")
    assert first == engine_root.root_path(tmp_path, "trixie")
    assert first != engine_root.root_path(tmp_path, "trixie", ("buildah", "runc"))
    assert first != engine_root.root_path(tmp_path, "forky")
    assert "nofile=" in engine_root.containers_conf()


@pytest.mark.parametrize(("argv", "message"), [
    ([], "usage: python -m builder.engine.chrooted ROOT COMMAND [ARG...]"),
    (["/nonexistent-root", "buildah"], "chrooted: error: /nonexistent-root is not a root filesystem (no usr/bin)"),
])
def test_chrooted_refuses_what_is_no_root_in_one_line(argv, message):
    result = subprocess.run([sys.executable, "-m", "builder.engine.chrooted", *argv], capture_output=True, text=True)
    assert (result.returncode, result.stderr.strip(), result.stdout) == (2, message, "")


def test_chrooted_shares_each_host_directory_once():
    repo = Path(__file__).resolve().parent.parent
    shared = chrooted.shared_directories(repo / "builder", f"{repo}::relative:/nonexistent-dir:/tmp/x/..")
    # The repository, or a directory above it (a checkout under /tmp), covers its subdirectory once.
    assert len([p for p in shared if repo.is_relative_to(p)]) == 1
    assert repo / "builder" not in shared
    assert not any(a != b and a.is_relative_to(b) for a in shared for b in shared)
    assert Path("/tmp") in shared and all(p.is_absolute() and p.is_dir() for p in shared)
    assert len(shared) == len(set(shared)) and Path("/") not in shared
