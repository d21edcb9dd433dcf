"""The Dockerfile is the spec, and the engine's version does not decide the image: buildah 1.28.2 (the
host's, Debian bookworm) and 1.39.3 (Debian trixie's, run from a root made with mmdebstrap) each build one
small image on the test base from its own empty storage. Put in canonical form, each engine's image is
the one the builder writes itself, by id; the engines' own images differ (docs/engines.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import EPOCH, TEST_BASE_TAG, write_context

from builder.engine import canonical_preview, chrooted, engine_root
from builder.engine.buildah import COMMAND_ENV, BuildahEngine, buildah_command
from builder.engine.protocol import BuildRequest
from builder.errors import BuildFailure, UserError
from builder.oci.layer_diff import compare, discard_storage, layer_entries, read_image

DOCKERFILE = f"""\
FROM {TEST_BASE_TAG}
ARG SOURCE_DATE_EPOCH
ARG BUILD_NETWORK=none
RUN ["python3", "-m", "venv", "/opt/venv"]
COPY hello.txt /opt/hello.txt
RUN --mount=type=bind,source=.,target=/run/context,ro ["cp", "/run/context/hello.txt", "/opt/mounted.txt"]
RUN ["/bin/sh", "-c", "mkdir -p /opt/x && echo hi > /opt/x/a && ln -s a /opt/x/b && ln /opt/x/a /opt/x/c && chmod 4755 /opt/x/a"]
LABEL dev.sglang-builder.test=engine-versions
WORKDIR /opt
ENV APP_HOME=/opt \\
    APP_MODE=test
EXPOSE 30000
ENTRYPOINT ["/bin/echo"]
CMD ["serve"]
RUN ["/bin/sh", "-c", "echo {{last}} > /opt/last.txt"]
"""


def request(tmp_path, last: str = "one", progress=None) -> BuildRequest:
    context = tmp_path / f"ctx-{last}"
    if not context.is_dir():  # written once: the bind mount's cache key sees the files' times
        write_context(context, DOCKERFILE.format(last=last), {"hello.txt": "hello\n"})
    return BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=("localhost/engine-versions:1",),
                        source_date_epoch=EPOCH, build_args={"SOURCE_DATE_EPOCH": str(EPOCH)}, network="none",
                        platform="linux/amd64", progress=progress)


@pytest.fixture
def private_engine(tmp_path, base_image, monkeypatch):
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))  # the write-once layer cache starts empty
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
def test_buildah_1_28_and_1_39_build_the_image_the_builder_writes(private_engine, trixie_buildah, tmp_path):
    """The rendered Dockerfile is the spec: each engine's own build of it, in canonical form, is the
    image the builder writes itself, by id; the engines' own images differ."""
    natives, written = {}, {}
    for name, command in (("bookworm", ["buildah"]), ("trixie", trixie_buildah)):
        engine = private_engine(name, command)
        natives[name] = engine.build_native(request(tmp_path))
        preview = engine.canonical_preview(natives[name], request(tmp_path))
        written[name] = engine.build(request(tmp_path))
        assert preview.image_id == written[name].image_id
        stored = engine.inspect(written[name].image_id)
        assert dict(preview.config) == dict(stored.config)
        assert [(l.diff_id, l.created_by) for l in preview.layers] == [(l.diff_id, l.created_by) for l in stored.layers]
        assert list((engine.storage_dir / "tmp").iterdir()) == []  # the layer buildah spooled went with it
        engine.save(written[name].image_id, tmp_path / f"{name}.tar")
    old, new = written["bookworm"], written["trixie"]
    assert old.identity.version.startswith("1.28.") and new.identity.version.startswith("1.39.")
    assert natives["bookworm"] != natives["trixie"]  # the engines' own images differ...
    assert old.image_id == new.image_id  # ...their canonical form does not
    assert compare(tmp_path / "bookworm.tar", tmp_path / "trixie.tar").identical
    image = read_image(tmp_path / "trixie.tar")
    built_layers = [layer_entries(image, layer) for layer in image.layers[1:]]
    assert all("etc/hostname" not in entries for entries in built_layers)
    assert all(entry[1] <= 0o7777 for entries in built_layers for entry in entries.values())
    assert "opt/x/a" in built_layers[3] and built_layers[3]["opt/x/a"][1] == 0o4755


@pytest.mark.engine
def test_two_steps_that_make_one_layer_are_read_once_and_give_the_written_image(private_engine, tmp_path):
    context = write_context(tmp_path / "ctx-repeat", f"FROM {TEST_BASE_TAG}\nCOPY a.txt /a.txt\nCOPY a.txt /a.txt\n"
                            "LABEL x=y\n", {"a.txt": "a\n"})
    repeated = BuildRequest(context_dir=context, dockerfile=context / "Dockerfile", tags=("localhost/engine-repeat:1",),
                            source_date_epoch=EPOCH, network="none", platform="linux/amd64")
    engine = private_engine("repeat", ["buildah"])
    native_id = engine.build_native(repeated)
    native = engine.inspect(native_id).layers
    assert native[1].diff_id == native[2].diff_id  # the same bytes: buildah's archive holds them once
    written = engine.build(repeated)
    assert len(written.layers) == 3 and written.layers[1].diff_id == written.layers[2].diff_id
    assert engine.canonical_preview(native_id, repeated).image_id == written.image_id


@pytest.mark.engine
def test_the_preview_of_an_image_the_engine_lacks_fails_in_one_line(private_engine, tmp_path):
    engine = private_engine("lacking", ["buildah"])
    base_id = engine.image_id(TEST_BASE_TAG)
    engine.remove(TEST_BASE_TAG)
    with pytest.raises(BuildFailure) as failure:
        canonical_preview.canonical_config(engine._global_args(), canonical_preview.NativeImage(
            base_id, {}, ("sha256:" + "0" * 64,), ("RUN true",), 0, 0), tmp_path / "scratch")
    assert str(failure.value).startswith(f"buildah push of {base_id} failed: ")
    assert "\n" not in str(failure.value)


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
