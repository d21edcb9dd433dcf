"""`builder base`: the mmdebstrap command, the image archive written by hand, the CLI's bad inputs,
and (with the engines) the real base: reproducible, loaded with the same digest everywhere."""

import hashlib
import json
import tarfile
from pathlib import Path

import pytest
from engine_helpers import BASE_EPOCH, EPOCH, TEST_BASE_TAG, tar_bytes

from builder.cli import main as cli_main
from builder.base.local_base import (
    DEFAULT_PACKAGES,
    BaseSpec,
    image_config,
    installed_packages,
    make_base,
    mmdebstrap_command,
    mmdebstrap_environment,
    write_image_archive,
)
from builder.cache.deb_cache import DebCache
from builder.cli.commands.base import spec_from_args
from lock_values import locked_base_packages, locked_base_sources, locked_base_spec
from builder.config.matrix import load_matrix
from builder.engine.buildah import BuildahEngine
from builder.engine.daemon import DockerDaemon


REPO_MATRIX = Path(__file__).resolve().parent.parent / "matrix.toml"


def test_mmdebstrap_command(tmp_path):
    argv = mmdebstrap_command(BaseSpec(source_date_epoch=EPOCH), tmp_path / "rootfs.tar", tmp_path / "repo",
                              tmp_path / "sources.list")
    # No network at all: mmdebstrap runs in a network namespace with no interfaces.
    assert argv[:3] == ["unshare", "--net", "--"]
    assert argv[3] == "mmdebstrap" and "--format=tar" in argv and "--variant=apt" in argv
    assert f"--include={','.join(sorted(DEFAULT_PACKAGES))}" in argv
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv
    assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in argv
    assert f"--customize-hook=upload {tmp_path / 'sources.list'} /etc/apt/sources.list" in argv
    # The suite and output, then the only source: the local repository of the locked .debs.
    assert argv[-3:] == ["bookworm", str(tmp_path / "rootfs.tar"),
                         f"deb [trusted=yes] copy://{tmp_path / 'repo'} bookworm main"]


def test_mmdebstrap_runs_with_its_own_environment_not_the_callers(monkeypatch):
    """Its maintainer scripts inherit it: a caller's PYTHONDONTWRITEBYTECODE (set or not) changed the
    base's debpython bytecode, so none of the caller's environment reaches it."""
    for name, value in (("PYTHONDONTWRITEBYTECODE", ""), ("LANG", "de_DE.UTF-8"), ("PYTHONHASHSEED", "7")):
        monkeypatch.setenv(name, value)
    assert mmdebstrap_environment(1767225600) == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1", "SOURCE_DATE_EPOCH": "1767225600"}


def test_spec_sorts_packages_and_names_the_tag():
    spec = BaseSpec(source_date_epoch=EPOCH, suite="trixie", packages=("python3", "patch", "python3"))
    assert spec.packages == ("patch", "python3")
    assert spec.tag == "localhost/builder-base:trixie"


def test_image_config_is_canonical_and_dated_by_the_epoch():
    config = image_config(BaseSpec(source_date_epoch=EPOCH), "ab" * 32)
    parsed = json.loads(config)
    assert parsed["created"] == "2025-01-01T00:00:00Z"
    assert parsed["config"]["Labels"]["org.opencontainers.image.created"] == "2025-01-01T00:00:00Z"
    assert parsed["rootfs"]["diff_ids"] == ["sha256:" + "ab" * 32]
    assert config == json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()


def rootfs(tmp_path, status=b""):
    path = tmp_path / "rootfs.tar"
    path.write_bytes(tar_bytes({"./etc/debian_version": b"12.8\n", "./var/lib/dpkg/status": status}))
    return path


def test_image_archive_is_byte_identical_and_its_id_is_the_config_digest(tmp_path):
    spec = BaseSpec(source_date_epoch=EPOCH, tag="localhost/builder-base-unit:1")
    layer = rootfs(tmp_path)
    diff_id = hashlib.sha256(layer.read_bytes()).hexdigest()
    first = write_image_archive(spec, layer, diff_id, tmp_path / "a.tar")
    second = write_image_archive(spec, layer, diff_id, tmp_path / "b.tar")
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())
        config = archive.extractfile(manifest[0]["Config"]).read()
    assert first == "sha256:" + hashlib.sha256(config).hexdigest()
    assert manifest[0]["RepoTags"] == ["localhost/builder-base-unit:1"]
    assert not list(tmp_path.glob("*.partial"))


def test_installed_packages_come_from_dpkg_status(tmp_path):
    status = (b"Package: zlib1g\nStatus: install ok installed\nVersion: 1:1.2.13\n\n"
              b"Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\n"
              b"Package: bash\nStatus: install ok installed\nVersion: 5.2.15-2+b7\n"
              b"Description: shell\n multi-line: text\n")
    assert installed_packages(rootfs(tmp_path, status)) == ("bash=5.2.15-2+b7", "zlib1g=1:1.2.13")


def test_cli_without_epoch_refuses_the_wall_clock(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # no matrix.toml here: the epoch must come from elsewhere
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert cli_main.main(["base", "--no-load"]) == 2
    assert capsys.readouterr().err == (
        "builder: error: no SOURCE_DATE_EPOCH: pass --source-date-epoch or set SOURCE_DATE_EPOCH "
        "(the wall clock is never used, so the base is reproducible)\n")


@pytest.mark.parametrize(("value", "message"), [
    ("yesterday", "SOURCE_DATE_EPOCH must be an integer, got 'yesterday'"),
    ("-5", "SOURCE_DATE_EPOCH must not be negative, got -5"),
])
def test_cli_bad_epoch(monkeypatch, capsys, tmp_path, value, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    assert cli_main.main(["base", "--no-load"]) == 2
    assert capsys.readouterr().err == f"builder: error: {message}\n"


def test_defaults_come_from_the_matrix(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "5")  # the matrix's date wins over the environment
    parser = cli_main.build_parser()
    spec, found = spec_from_args(parser.parse_args(["base", "--matrix", str(REPO_MATRIX)]))
    matrix = load_matrix(REPO_MATRIX)
    name = found.local_base["name"]
    assert found.path == matrix.path and name == matrix.local_base["name"]
    assert spec.source_date_epoch == matrix.source_date_epoch
    assert spec.tag == f"localhost/builder-base:{name}"
    assert spec.suite == matrix.local_base["suite"]
    assert spec.packages == tuple(sorted(matrix.local_base["packages"]))
    flagged, _ = spec_from_args(parser.parse_args(
        ["base", "--matrix", str(REPO_MATRIX), "--source-date-epoch", "7", "--tag", "localhost/b:1"]))
    assert (flagged.source_date_epoch, flagged.tag) == (7, "localhost/b:1")


def test_cli_without_a_matrix_has_no_lock_to_build_from(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "5")
    assert cli_main.main(["base", "--no-load"]) == 2
    assert capsys.readouterr().err == ("builder: error: builder base builds from the .debs matrix.lock records: "
                                       "run it beside matrix.toml, or name one with --matrix\n")


def test_a_lock_without_the_base_packages_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BUILDER_LOCK", str(tmp_path / "empty.lock"))
    assert cli_main.main(["base", "--no-load", "--matrix", str(REPO_MATRIX)]) == 2
    assert capsys.readouterr().err == ("builder: error: matrix.lock records no system packages for the local "
                                       "base: run `builder lock`\n")


def test_named_matrix_that_is_missing_is_an_error(tmp_path, capsys):
    assert cli_main.main(["base", "--no-load", "--matrix", str(tmp_path / "nope.toml")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("builder: error: ") and "nope.toml" in error and len(error.splitlines()) == 1


@pytest.mark.engine
def test_hand_written_archive_loads_with_its_digest_in_both_engines(tmp_path):
    spec = BaseSpec(source_date_epoch=EPOCH, tag="localhost/builder-base-unit:1")
    layer = rootfs(tmp_path)
    expected = write_image_archive(
        spec, layer, hashlib.sha256(layer.read_bytes()).hexdigest(), tmp_path / "image.tar")
    buildah = BuildahEngine(storage_dir=tmp_path / "storage", export_to_docker=False)
    try:
        assert buildah.load(tmp_path / "image.tar") == expected
        assert buildah.inspect(spec.tag).tags == (spec.tag,)
    finally:
        buildah.reset_storage()
    daemon = DockerDaemon()
    try:
        assert daemon.load(tmp_path / "image.tar") == expected
        assert daemon.image_id(spec.tag) == expected
    finally:
        daemon.remove(spec.tag)


@pytest.mark.engine
@pytest.mark.network
def test_real_base_is_reproducible_and_loaded_everywhere(base_image, tmp_path, monkeypatch):
    # A second, independent mmdebstrap run gives the same tarball and so the same digest, into a relative
    # folder as `builder base`'s default output is (build/base).
    monkeypatch.chdir(tmp_path)
    again = make_base(locked_base_spec(source_date_epoch=BASE_EPOCH, tag=TEST_BASE_TAG), Path("."), locked_base_packages(),
                      DebCache(), sources=locked_base_sources())
    assert again.rootfs_sha256 == base_image.rootfs_sha256
    assert again.image_id == base_image.image_id
    assert again.archive.read_bytes() == base_image.archive.read_bytes()
    assert BuildahEngine().image_id(TEST_BASE_TAG) == base_image.image_id
    assert DockerDaemon().image_id(TEST_BASE_TAG) == base_image.image_id
    record = json.loads((tmp_path / "base-bookworm-amd64.json").read_text())
    assert record["image_id"] == base_image.image_id and record["source_date_epoch"] == BASE_EPOCH
    names = {package.split("=")[0] for package in base_image.packages}
    assert set(DEFAULT_PACKAGES) <= names
    # Kept small: no perl beyond perl-base, no documentation except licences.
    assert "perl" not in names and "usrmerge" not in names
    with tarfile.open(base_image.archive) as outer:
        manifest = json.loads(outer.extractfile("manifest.json").read())[0]
        with tarfile.open(fileobj=outer.extractfile(manifest["Layers"][0])) as layer:
            paths = layer.getnames()
    assert "./etc/hostname" not in paths and "./etc/resolv.conf" not in paths
    assert not [p for p in paths if p.startswith("./usr/share/man/") and not p.endswith("/")]
    # About 150 MB of Debian's Python and libraries, and about 200 MB of g++ (nvcc's host compiler).
    assert base_image.rootfs_bytes < 400 * 1024 * 1024
