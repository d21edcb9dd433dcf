"""System packages locked like wheels, proved on a Debian archive served from 127.0.0.1.

The archive (tests/loopback_debian.py) holds the real bookworm .debs of the local base's closure,
its InRelease signed by a key made here. `builder lock` resolves the base from it; then the archive
moves (one package gets a newer version, built here under the same name, and the old file leaves the
mirror for the snapshot archive), and `builder base` from the lock still makes the locked digest from
an empty cache, while `builder lock` names the version change and makes the new digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import urllib.request
from pathlib import Path

import pytest

from builder.base.local_base import DEFAULT_PACKAGES
from builder.cache.deb_cache import DebCache
from builder.config.stack import AptSpec
from builder.errors import BuildFailure, UserError
from builder.lock import debian_archive
from builder.lock import store
from builder.lock import system_packages as locked_debs
from loopback_debian import DebianMirror, Signer, control, real_debs, rebuilt
from loopback_index import LoopbackServer, cu130_env, cu130_project
from checkouts import REPO, run_builder

FIRST_DATE, FIRST_STAMP = "Thu, 01 Jan 2026 00:00:00 UTC", "20260101T000000Z"
MOVED_DATE = "Sun, 01 Feb 2026 00:00:00 UTC"
BASE_NAME = "debs-loopback-test"
MOVED = "libnuma1"  # a leaf the base asks for: a point release that moves one library


def _field(deb: Path, name: str) -> str:
    return re.search(rf"^{name}: (.*)$", control(deb), re.MULTILINE).group(1)


@pytest.fixture(scope="module")
def debs():
    """The real base closure's files (fetched once through apt's default mirror into the host's cache)."""
    return real_debs()


def _project(directory: Path, server: LoopbackServer, mirror: DebianMirror, keyring: Path):
    """The real matrix (its cu130 row on loopback stand-in wheels) with the local base read from `mirror`."""
    project = cu130_project(directory, server, "127.0.0.1:9", (mirror.source_line, keyring))
    text = project.matrix.read_text()
    old = 'name = "debian-bookworm"\n'
    assert text.count(old) == 1
    project.matrix.write_text(text.replace(old, f'name = "{BASE_NAME}"\nsources = ["{mirror.source_line}"]\n'
                                                f'keyring = "{keyring}"\nsnapshot = "{mirror.snapshot}"\n'))
    return project


def _env(project, directory: Path, cache: str) -> dict:
    """Its own lock, .deb and wheel cache, and buildah storage (the base is loaded there, not beside the lead's)."""
    storage = directory / "storage"
    conf = directory / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{storage}/root"\nrunroot = "{storage}/run"\n')
    env = cu130_env(project)
    (Path(env["DOCKER_CONFIG"]) / "config.json").write_text("{}\n")  # buildah reads it when loading the base
    return {**env, "BUILDER_CACHE": str(directory / cache), "CONTAINERS_STORAGE_CONF": str(conf)}


def _resolution(project):
    return store.entry("sglang-0.5.9-cu130-local", project.root / "matrix.lock").resolution


@pytest.mark.engine
@pytest.mark.network
def test_a_moved_archive_still_gives_the_locked_base_and_relocking_says_what_moved(debs, tmp_path):
    server = LoopbackServer(tmp_path / "served")
    signer = Signer(tmp_path / "signer")
    mirror = DebianMirror(server, signer)
    mirror.publish(debs, FIRST_DATE)
    project = _project(tmp_path / "project", server, mirror, signer.keyring)
    lock_args = ("lock", "--matrix", str(project.matrix), "--stack", "sglang-0.5.9-cu130", "--local-base")
    try:
        first = run_builder(*lock_args, env=_env(project, tmp_path, "cache-1"))
        assert first.returncode == 0, first.stderr
        resolution = _resolution(project)
        locked = resolution.system_packages
        assert {p.basename for p in locked.packages} == {deb.name for deb in debs}
        # The archive by name, suite, signed state and snapshot; the mirror that served it is not recorded.
        with urllib.request.urlopen(f"{mirror.uri}/dists/bookworm/InRelease") as response:
            in_release = hashlib.sha256(response.read()).hexdigest()
        assert locked.archives == (locked_debs.DebArchive(
            "debian", "bookworm", ("main",), FIRST_DATE, f"{server.url}/snapshot/debian/{FIRST_STAMP}", in_release),)
        assert mirror.uri not in (project.root / "matrix.lock").read_text()
        digest = resolution.base.image_id
        assert digest.startswith("sha256:")
        assert f"{len(debs)} system packages locked from debian bookworm" in first.stdout
        assert f"{BASE_NAME} base: none -> {digest}" in first.stdout

        # The archive moves: a newer libnuma1 under the same name; the old file is only in the snapshot.
        old = next(deb for deb in debs if deb.name.startswith(f"{MOVED}_"))
        old_version = _field(old, "Version")
        newer = rebuilt(old, f"{old_version}+moved1", tmp_path / "upload")
        mirror.publish([deb for deb in debs if deb != old] + [newer], MOVED_DATE)
        mirror.keep_in_snapshot(old, FIRST_STAMP)

        # From the lock, with an empty cache: the same digest, the old file taken from the snapshot.
        again = run_builder("base", "--matrix", str(project.matrix), "--output", str(tmp_path / "base-2"),
                            env=_env(project, tmp_path, "cache-2"))
        assert again.returncode == 0, again.stderr
        assert f"base localhost/builder-base:{BASE_NAME}: {digest}" in again.stdout
        package = next(p for p in locked.packages if p.name == MOVED)
        assert DebCache(tmp_path / "cache-2" / "locked-debs").path(package).read_bytes() == old.read_bytes()

        relocked = run_builder(*lock_args, env=_env(project, tmp_path, "cache-2"))
        assert relocked.returncode == 0, relocked.stderr
        assert f"sglang-0.5.9-cu130-local: system package {MOVED} {old_version} -> {old_version}+moved1" \
            in relocked.stdout
        assert len(re.findall("system package ", relocked.stdout)) == 1  # nothing else moved
        new_digest = _resolution(project).base.image_id
        assert new_digest.startswith("sha256:") and new_digest != digest
        assert f"{BASE_NAME} base: {digest} -> {new_digest}" in relocked.stdout
    finally:
        server.stop()


@contextlib.contextmanager
def _locked_from_a_mirror(debs, tmp_path):
    """A signed loopback mirror with no snapshot, the base's packages locked from it, and libnuma1's
    locked .deb: (mirror, spec, locked, libnuma1)."""
    server = LoopbackServer(tmp_path / "served")
    signer = Signer(tmp_path / "signer")
    mirror = DebianMirror(server, signer)
    mirror.publish(debs, FIRST_DATE)
    try:
        spec = AptSpec("debian", "bookworm", DEFAULT_PACKAGES, "root", sources=(mirror.source_line,),
                       keyring=str(signer.keyring), snapshot="")
        locked = debian_archive.resolve(spec)
        yield mirror, spec, locked, next(p for p in locked.packages if p.name == "libnuma1")
    finally:
        server.stop()


@pytest.mark.network
def test_d_a_tampered_deb_is_refused_by_its_hash_in_one_line(debs, tmp_path):
    with _locked_from_a_mirror(debs, tmp_path) as (mirror, spec, locked, victim):
        served = mirror.root / victim.filename
        served.write_bytes(served.read_bytes()[:-16] + b"\0" * 16)  # same name and size, other bytes
        cache = DebCache(tmp_path / "cache")
        with pytest.raises(BuildFailure) as refused:
            cache.fill(locked, "row", lambda: spec.sources)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"row: {mirror.uri}/{victim.filename} is not the locked libnuma1=")
        assert message.endswith("refused")
        assert not cache.path(victim).exists() and not list((cache.root / "staging").iterdir())


@pytest.mark.network
def test_d_a_deb_no_source_serves_fails_in_one_line_and_the_others_are_kept(debs, tmp_path):
    with _locked_from_a_mirror(debs, tmp_path) as (mirror, spec, locked, victim):
        (mirror.root / victim.filename).unlink()  # the mirror moved on and there is no snapshot
        cache = DebCache(tmp_path / "cache")
        with pytest.raises(BuildFailure) as failed:
            cache.fill(locked, "row", lambda: spec.sources)
        message = str(failed.value)
        assert "\n" not in message
        assert message == f"row: {victim.pin} could not be fetched: {mirror.uri}/{victim.filename}: 404"
        # The downloads run at once, and each ran to its end: the next fill fetches only the missing one.
        assert cache.missing(locked) == [victim]
        assert not list((cache.root / "staging").iterdir())


@pytest.mark.network
def test_d_a_bad_inrelease_signature_is_refused_in_one_line_and_nothing_is_locked(debs, tmp_path):
    server = LoopbackServer(tmp_path / "served")
    trusted, other = Signer(tmp_path / "trusted"), Signer(tmp_path / "other", name="someone else")
    mirror = DebianMirror(server, other)  # signed by a key the keyring does not hold
    mirror.publish(debs, FIRST_DATE)
    project = _project(tmp_path / "project", server, mirror, trusted.keyring)
    try:
        result = run_builder("lock", "--matrix", str(project.matrix), "--stack", "sglang-0.5.9-cu130", "--local-base",
                             env=_env(project, tmp_path, "cache"))
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1
        assert result.stderr.startswith(f"builder: error: sglang-0.5.9-cu130-local: InRelease of {mirror.uri} "
                                        f"bookworm: signature refused by gpgv with {trusted.keyring}")
        assert result.stderr.rstrip().endswith("nothing was locked")
        assert not (project.root / "matrix.lock").exists()
        # The text under a good signature altered afterwards is refused the same way.
        signed = mirror.root / "dists/bookworm/InRelease"
        mirror.signer = trusted
        mirror.publish(debs, FIRST_DATE)
        signed.write_bytes(signed.read_bytes().replace(b"Date: Thu", b"Date: Fri"))
        with pytest.raises(UserError, match="signature refused by gpgv"):
            debian_archive.resolve(AptSpec("debian", "bookworm", ("patch",), "root", sources=(mirror.source_line,),
                                           keyring=str(trusted.keyring)))
    finally:
        server.stop()


def test_c_no_rendered_dockerfile_runs_apt():
    dockerfiles = sorted((REPO / "images").glob("*/Dockerfile"))
    assert len(dockerfiles) >= 4
    for dockerfile in dockerfiles:
        text = dockerfile.read_text()
        runs = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in runs if re.search(r"\bapt(-get)?\b", line)], dockerfile
    # The registry rows install their locked .debs from the read-only mount instead.
    registry = (REPO / "images/sglang-0.5.9-cu130/Dockerfile").read_text()
    assert "RUN --mount=type=bind,source=debs,target=/run/debs,ro" in registry


def test_version_changes_name_each_move():
    archive = locked_debs.DebArchive("debian", "bookworm", ("main",), FIRST_DATE, "")

    def packages(**versions):
        return locked_debs.SystemPackages("debian", "amd64", "root", (), (archive,), tuple(
            locked_debs.DebPackage(name, version, "amd64", f"pool/{name}.deb", 1, "0" * 64, 0)
            for name, version in sorted(versions.items())))

    old, new = packages(a="1", b="2", c="3"), packages(a="1", b="2.1", d="4")
    assert locked_debs.version_changes(old, new) == ["b 2 -> 2.1", "c 3 -> (none)", "d (none) -> 4"]
    assert locked_debs.SystemPackages.from_dict(new.to_dict()) == new


def test_the_lock_names_the_archive_and_reads_what_older_locks_wrote():
    """An entry locked behind an internal mirror recorded that mirror's address; read back, it names only
    the archive, and the next write leaves the address out. The committed lock holds none."""
    older = {"uri": "http://apt-cache.internal.example:3142/debian-security", "suite": "bookworm-security",
             "components": ["main"], "date": FIRST_DATE, "snapshot": ""}
    archive = locked_debs.DebArchive.from_dict(older)
    assert (archive.name, archive.suite, archive.in_release) == ("debian-security", "bookworm-security", "")
    assert "internal" not in str(archive.to_dict()) and "uri" not in archive.to_dict()
    committed = (REPO / "matrix.lock").read_text()
    assert '"uri":' not in committed.split('"system_packages"', 1)[-1]


def test_a_fetch_takes_the_mirror_from_the_sources_by_archive_and_suite(tmp_path):
    archive = locked_debs.DebArchive("debian-security", "bookworm-security", ("main",), FIRST_DATE, "")
    lines = ("deb http://127.0.0.1:9/debian bookworm main",
             "deb http://127.0.0.1:9/debian-security bookworm-security main")
    assert debian_archive.mirror_for(archive, lines) == "http://127.0.0.1:9/debian-security"
    assert debian_archive.mirror_for(archive, lines[:1]) is None
    with pytest.raises(UserError, match="no apt source serves debian-security bookworm-security, and it has no snapshot"):
        DebCache(tmp_path / "cache").fill(locked_debs.SystemPackages(
            "debian", "amd64", "added", ("xz",), (archive,),
            (locked_debs.DebPackage("xz", "1", "amd64", "pool/main/x/xz_1_amd64.deb", 1, "0" * 64, 0),)), "row")


@pytest.mark.parametrize("mismatches, refused", [(1, False), (2, True)])
def test_a_packages_file_caught_mid_sync_is_read_once_more_and_refused_the_second_time(monkeypatch, mismatches,
                                                                                      refused):
    """A mirror replaces InRelease and its Packages files a few seconds apart while it syncs: one mismatch
    is read again from InRelease on; a second is the one-line refusal."""
    source = debian_archive.AptSource("http://127.0.0.1:9/debian", "bookworm", ("main",))
    reads = []

    def read(source, keyring, architecture):
        reads.append(source)
        if len(reads) <= mismatches:
            raise debian_archive._IndexMismatch(f"{source.uri} bookworm: main/binary-amd64/Packages.xz does not "
                                                "match the sha256 its signed InRelease lists; refused")
        return "index"

    monkeypatch.setattr(debian_archive, "_read_source", read)
    monkeypatch.setattr(debian_archive.time, "sleep", lambda seconds: None)
    if refused:
        with pytest.raises(UserError, match="does not match the sha256 its signed InRelease lists; refused$"):
            debian_archive.read_source(source, Path("/dev/null"), "amd64")
    else:
        assert debian_archive.read_source(source, Path("/dev/null"), "amd64") == "index"
    assert len(reads) == 2
