"""The CUDA 13 row locked end to end with every kind of source on loopback (tests/loopback_index.py):
its `index =` sources (PyTorch's and FlashInfer's), its `url =` wheel and pip's default index served
from 127.0.0.1 with small wheels built here, and its base image (the local base `builder base` made,
pushed under the nvidia/cuda name and tag) on Debian's docker-registry. `builder lock` resolves and
hashes the closure and the base digest, `builder render` writes the hashed requirements and
`FROM image@digest`, and pip installs exactly the locked files from the loopback sources and refuses
a wheel the server swapped."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.base import dpkg
from builder.build_stack import build, context
from builder.cache import deb_cache, wheel_cache
from builder.cli.main import main
from builder.config.matrix import load_matrix
from builder.engine.buildah import BuildahEngine
from builder.engine.progress import Progress
from builder.errors import UserError
from builder.lock import records, store
from builder.lock import base_digest
from builder.lock.model import ImageRecord, LockedBase
from builder.lock.resolution import base_pin, check_current, record_base
from builder.net.registry_http import Retry
from builder.oci.layer_diff import discard_storage
from loopback_debian import DebianMirror, Signer, real_debs
from loopback_index import ROW_SYSTEM_PACKAGES, LoopbackServer, cu130_env, cu130_project, sha256_of
from checkouts import REPO, run_builder
from engine_helpers import engine_image
from lock_values import smoke_report
from registries import Registry, free_port

pytestmark = pytest.mark.engine  # the registry's base is pushed from buildah's storage


def distributions(locked) -> dict:
    return {d.name: d for d in locked["resolution"].distributions}

LOCAL_ROW = "sglang-0.5.9-cu128-local"  # its lock entry holds the digest `builder base` recorded


@pytest.fixture(scope="module")
def pushed_base(tmp_path_factory, local_base):
    """A loopback registry holding the local base under the CUDA 13 base's name and tag."""
    root = tmp_path_factory.mktemp("registry")
    server = Registry(root / "registry", free_port())
    server.root.mkdir()
    server.start()
    reference = f"{server.host}/nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    digest_file = root / "pushed.digest"
    subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", "--disable-compression",
                    "--digestfile", str(digest_file), local_base, f"docker://{reference}"], check=True)
    yield {"registry": server, "local_base": local_base, "pushed_digest": digest_file.read_text().strip()}
    server.stop()


@pytest.fixture(scope="module")
def locked(tmp_path_factory, pushed_base):
    """The project, locked and rendered through the command line."""
    server = LoopbackServer(tmp_path_factory.mktemp("sources"))
    # Debian's archive on loopback as the row's archive (real bookworm .debs, a key made here).
    signer = Signer(tmp_path_factory.mktemp("signer"))
    mirror = DebianMirror(server, signer)
    mirror.publish(real_debs(ROW_SYSTEM_PACKAGES), "Thu, 01 Jan 2026 00:00:00 UTC")
    project = cu130_project(tmp_path_factory.mktemp("project"), server, pushed_base["registry"].host,
                            (mirror.source_line, signer.keyring))
    env = cu130_env(project)
    lock_run = run_builder("lock", "--matrix", str(project.matrix), "--stack", project.stack, env=env)
    render_run = run_builder("render", "--matrix", str(project.matrix), "--stack", project.stack, env=env)
    yield {"project": project, "server": server, "env": env, "lock": lock_run, "render": render_run, "mirror": mirror,
           "resolution": store.entry(project.stack, project.root / "matrix.lock").resolution}
    server.stop()


def test_lock_records_the_registry_digest_of_the_base_builder_base_made(locked, pushed_base):
    assert locked["lock"].returncode == 0, locked["lock"].stderr
    registry = pushed_base["registry"]
    base = locked["resolution"].base
    digest = registry.manifest_digest("nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04")
    assert base == LockedBase("cuda-13.0.1", locked["project"].base_image, False, manifest_digest=digest)
    assert digest == pushed_base["pushed_digest"]
    # That manifest is the image `builder base` made: its config digest (the image id) is what the lock records.
    manifest = json.loads(subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.Manifest}}", pushed_base["local_base"]],
        check=True, capture_output=True, text=True).stdout)
    recorded = store.entry(LOCAL_ROW, REPO / "matrix.lock").resolution.base.image_id
    assert manifest["config"]["digest"] == recorded


def test_every_source_kind_is_locked_from_the_right_place(locked):
    project, resolution = locked["project"], locked["resolution"]
    found = distributions(locked)
    versions = {name: item.version for name, item in found.items()}
    assert versions == {"filelock": "3.20.0", "flashinfer-cubin": "0.6.4", "flashinfer-jit-cache": "0.6.4+cu130",
                        "flashinfer-python": "0.6.4", "sgl-kernel": "0.3.21+cu130", "sglang": "0.5.9",
                        "torch": "2.9.1+cu130"}
    sources = {name: item.source for name, item in found.items()}
    assert sources == {"filelock": "default index", "flashinfer-cubin": "default index",
                       "flashinfer-jit-cache": project.flashinfer_index, "flashinfer-python": "default index",
                       "sgl-kernel": project.sgl_kernel_url, "sglang": "default index",
                       "torch": project.torch_index}
    for name, item in found.items():
        assert item.sha256 == sha256_of(project.wheel(name, item.version)), name
        assert item.hashes == (item.sha256,)
    assert resolution.indexes == (project.flashinfer_index, project.torch_index)
    assert resolution.index_strategy == "unsafe-best-match"
    assert {name: item.group for name, item in found.items()} == {
        "torch": "torch", "filelock": "torch", "sgl-kernel": "kernels", "flashinfer-python": "kernels",
        "flashinfer-cubin": "kernels", "flashinfer-jit-cache": "kernels", "sglang": "sglang"}


def test_render_writes_hashed_requirements_and_the_pinned_base(locked):
    assert locked["render"].returncode == 0, locked["render"].stderr
    project, found = locked["project"], distributions(locked)
    folder = project.root / "images" / project.stack
    dockerfile = (folder / "Dockerfile").read_text()
    pinned = project.base_image.removesuffix(":13.0.1-cudnn-devel-ubuntu24.04") + "@" + locked["resolution"].base.manifest_digest
    assert (f"\n# {project.base_image}, pinned to the digest `builder lock` resolved (matrix.lock).\n"
            f"FROM {pinned}\n") in dockerfile
    torch = (folder / "requirements" / "10-torch.txt").read_text()
    # Exactly the locked file per distribution and no source: the build installs with --no-index
    # from the wheel cache, which `builder fetch` fills from the index, URL and default index.
    assert torch.splitlines()[2:] == [
        "filelock==3.20.0 \\", f"    --hash=sha256:{found['filelock'].sha256}",
        "torch==2.9.1+cu130 \\", f"    --hash=sha256:{found['torch'].sha256}"]
    kernels = (folder / "requirements" / "20-kernels.txt").read_text()
    assert f"sgl-kernel==0.3.21+cu130 \\\n    --hash=sha256:{found['sgl-kernel'].sha256}\n" in kernels
    check = run_builder("render", "--check", "--matrix", str(project.matrix), "--stack", project.stack,
                        env=locked["env"])
    assert check.returncode == 0, check.stdout + check.stderr


def _fetch(locked, cache: Path) -> subprocess.CompletedProcess:
    project = locked["project"]
    return run_builder("fetch", "--matrix", str(project.matrix), "--stack", project.stack,
                       env={**locked["env"], "BUILDER_CACHE": str(cache)})


def test_fetch_takes_every_file_from_its_source_and_pip_installs_exactly_those(locked, tmp_path):
    """`builder fetch` fills the cache from the loopback default index, both extra indexes and the
    release URL; the rendered requirements then install, with no index at all, the locked files."""
    fetched = _fetch(locked, tmp_path / "cache")
    assert fetched.returncode == 0, fetched.stderr
    wheel_bytes = sum(p.stat().st_size for p in locked['project'].wheels.values() if _locked(locked, p))
    assert (f"7 locked wheels in {tmp_path / 'cache' / 'locked-wheels'} (7 downloaded, {wheel_bytes} bytes)\n"
            in fetched.stdout)
    # And the .debs the row's base gets (jq with libjq1 and libonig5), from the loopback Debian archive.
    assert fetched.stdout.endswith(f"3 locked .debs in {tmp_path / 'cache' / 'locked-debs'} (3 downloaded, "
                                   f"{sum(p.size for p in locked['resolution'].system_packages.packages)} bytes, "
                                   "0 from the snapshot archive)\n")
    project, found = locked["project"], distributions(locked)
    flat = tmp_path / "wheels"
    flat.mkdir()
    for item in found.values():
        (flat / item.wheel).symlink_to(tmp_path / "cache" / "locked-wheels" / "sha256" / item.sha256 / item.wheel)
    requirements = sorted((project.root / "images" / project.stack / "requirements").glob("*.txt"))
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-index",
         "--find-links", str(flat), "--no-deps", "--require-hashes", "--only-binary=:all:",
         "--target", str(tmp_path / "site"), *(arg for path in requirements for arg in ("-r", str(path)))],
        capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    metadata = {}
    for info in (tmp_path / "site").glob("*.dist-info"):
        fields = dict(line.split(": ", 1) for line in (info / "METADATA").read_text().splitlines() if ": " in line)
        metadata[fields["Name"]] = fields["Version"]
    assert metadata == {name: item.version for name, item in found.items()}
    origin = {name: (tmp_path / "site" / name.replace("-", "_") / "__init__.py").read_text() for name in found}
    assert origin["torch"] == "SOURCE = 'torch-cu130'\n"
    assert origin["filelock"] == "SOURCE = 'default'\n"  # not the PyTorch index's older copy
    assert origin["flashinfer-jit-cache"] == "SOURCE = 'flashinfer-cu130'\n"
    assert origin["sgl-kernel"] == "SOURCE = 'v0.3.21'\n"  # the release URL's folder


def _locked(locked, path: Path) -> bool:
    return any(item.wheel == path.name and item.sha256 == sha256_of(path)
               for item in locked["resolution"].distributions)


@pytest.mark.parametrize("name, version", [("torch", "2.9.1+cu130"), ("sgl-kernel", "0.3.21+cu130")])
def test_a_wheel_swapped_on_the_server_is_refused_by_hash(locked, tmp_path, name, version):
    project, server = locked["project"], locked["server"]
    wheel = project.wheel(name, version)
    original = server.tamper(wheel)
    try:
        fetched = _fetch(locked, tmp_path / "cache")
    finally:
        server.restore(wheel, original)
    assert fetched.returncode == 1
    assert fetched.stderr.splitlines()[-1] + "\n" == (f"builder: error: {project.stack}: 1 locked wheels could not be fetched ({name}=={version}): "
                              "the file served is not the one the lock names (sha256 differs); pip refused it\n")
    expected = distributions(locked)[name].sha256
    assert not (tmp_path / "cache" / "locked-wheels" / "sha256" / expected).exists()
    kept = list((tmp_path / "cache" / "locked-wheels" / "sha256").iterdir())
    assert len(kept) == 6  # every other file matched the lock and stays


def test_an_unreachable_base_is_one_line_and_the_lock_is_untouched(locked, tmp_path, monkeypatch, capsys):
    """The same project with its base on a port nothing listens on: the wheels resolve, the base does not."""
    project = locked["project"]
    dead = f"127.0.0.1:{free_port()}/nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    matrix = project.root / "matrix-dead-base.toml"
    matrix.write_text(project.matrix.read_text().replace(project.base_image, dead))
    lock_file = project.root / "matrix.lock"
    before = lock_file.read_bytes()
    for key, value in locked["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("BUILDER_LOCK", raising=False)
    delays: list[float] = []
    monkeypatch.setattr(base_digest, "RETRY", Retry(2, 0.01, delays.append, UserError))
    assert main(["lock", "--matrix", str(matrix), "--stack", project.stack]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"builder: error: {project.stack}: resolving base {dead} failed after 2 attempts: "
                       f"registry {dead.split('/')[0]} unreachable (connection refused); nothing was locked")
    assert delays == [0.01]
    assert lock_file.read_bytes() == before


def _unpatched_local_row(locked, root: Path, cache: Path):
    """The row on the local base in `root` (the loopback project, or a copy of it), locked, rendered and
    fetched by the CLI with its patch series left out (it patches the real sglang and flashinfer, which
    these stand-in wheels are not), its base the digest the committed lock records; returns its build
    request, built from the fetched wheels with no network, and what it was made from."""
    matrix = root / "matrix-unpatched.toml"
    text = (root / "matrix.toml").read_text()
    assert text.count('patched = ["sglang", "flashinfer-python"]') == 1
    matrix.write_text(text.replace('patched = ["sglang", "flashinfer-python"]', "patched = []"))
    if not (root / "builder").exists():
        (root / "builder").symlink_to(REPO / "builder")  # the in-image tools the Dockerfile copies
    env = {**locked["env"], "BUILDER_CACHE": str(cache)}
    stack_name = locked["project"].stack
    # --no-base: the test takes the base digest the committed lock records (below), not a new base.
    for command in (["lock", "--no-base"], ["render"], ["fetch"]):
        done = run_builder(*command, "--matrix", str(matrix), "--stack", stack_name, "--local-base", env=env)
        assert done.returncode == 0, (command, done.stderr)
    lock_path = root / "matrix.lock"
    recorded = store.entry(LOCAL_ROW, REPO / "matrix.lock").resolution.base.image_id
    record_base("debian-bookworm", recorded, lock_path)  # what `builder base` records for the local base

    stack = load_matrix(matrix, local_base=True).stack(stack_name + "-local")
    resolution = check_current(stack, lock_path).resolution
    wheels = wheel_cache.WheelCache(cache / "locked-wheels")
    progress = Progress.for_environment()
    fetched = build.fetch_wheels(stack, resolution, wheels, offline=True, progress=progress)
    assert fetched.downloaded_bytes == 0  # offline: everything was already in the cache
    inputs = context.build_inputs(stack, root, base_pin(stack, resolution))
    dockerfile = build.stage_context(inputs, root, resolution, wheels, cache.parent / "context")
    request = build.build_request(stack, cache.parent / "context", dockerfile, "localhost/loopback-row:test", False,
                                  progress)
    return {"matrix": matrix, "env": env, "stack": stack, "resolution": resolution, "inputs": inputs,
            "request": request, "lock": lock_path}


def test_the_row_builds_on_the_local_base_from_the_fetched_wheels_with_no_network(locked, local_base, tmp_path):
    """The same row on the local base, locked and rendered by the CLI, its wheels fetched from the
    loopback sources, then built by buildah from exactly the rendered Dockerfile with no network at
    all: the image holds the locked files."""
    row = _unpatched_local_row(locked, locked["project"].root, tmp_path / "cache")
    request, resolution = row["request"], row["resolution"]
    assert request.network == "none" and not request.add_hosts and not request.secrets
    engine = BuildahEngine(export_to_docker=False)
    try:
        engine.build(request)
        with engine.mounted(request.tags[0]) as root:
            site = root / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
            origin = {name: (site / name.replace("-", "_") / "__init__.py").read_text()
                      for name in (d.name for d in resolution.distributions)}
            found = dict(path.name.removesuffix(".dist-info").split("-") for path in site.glob("*.dist-info"))
            versions = {name: version for name, version in found.items() if name not in ("pip", "setuptools")}
    finally:
        engine.remove(request.tags[0])
    assert versions == {d.name.replace("-", "_"): d.version for d in resolution.distributions}
    assert origin["torch"] == "SOURCE = 'torch-cu130'\n"
    assert origin["filelock"] == "SOURCE = 'default'\n"
    assert origin["sgl-kernel"] == "SOURCE = 'v0.3.21'\n"


@pytest.mark.network  # trixie's buildah comes from apt's default mirror
def test_the_rows_dockerfile_built_by_either_buildah_is_the_image_the_builder_writes(locked, local_base, trixie_buildah,
                                                                                   tmp_path, monkeypatch):
    """One spec, two builders, on a small row: its rendered Dockerfile built by plain buildah (bookworm's
    1.28.2, and trixie's 1.39.3 from its root) and put in canonical form is the image the builder writes
    step by step: every layer the same bytes, so the same paths, types, modes, owners, sizes, contents,
    times, link targets and xattrs, and one image id."""
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "write-once-cache"))
    request = _unpatched_local_row(locked, locked["project"].root, tmp_path / "cache")["request"]
    bookworm = BuildahEngine(export_to_docker=False)
    trixie = BuildahEngine(storage_dir=tmp_path / "storage-trixie", export_to_docker=False, command=trixie_buildah)
    written_tag, built_tag = "localhost/loopback-row:written", "localhost/loopback-row:built"  # the latter never tagged
    try:
        written = bookworm.build(dataclasses.replace(request, tags=(written_tag,)))
        assert written.written_layers > 0 and written.reused_layers == 0
        bookworm.save(local_base, tmp_path / "base.docker.tar")
        trixie.load(tmp_path / "base.docker.tar")
        assert trixie.version().startswith("1.39")
        for engine in (bookworm, trixie):
            built = engine_image(engine, dataclasses.replace(request, tags=(built_tag,), no_cache=True))
            assert [layer.diff_id for layer in built.layers] == [layer.diff_id for layer in written.layers]
            assert built.image_id == written.image_id
    finally:
        bookworm.remove(written_tag)
        discard_storage(trixie, trixie.storage_dir)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args], cwd=root,
                   check=True, capture_output=True)


def test_verify_against_lock_rebuilds_head_from_empty_storage_and_names_a_planted_label_and_file(
        locked, local_base, tmp_path, monkeypatch):
    """`builder verify --against-lock` on the row, in a git work tree: the image the lock records is
    built again from the committed inputs in empty storage and found identical; after a commit that
    plants a label and a changed in-image tool, it names both. (The row's small stand-in wheels make this
    a minute: the same path on the 11.5 GB stack takes about 9, and the cold CI run builds that stack from
    empty storage anyway.)"""
    root = tmp_path / "repo"
    shutil.copytree(locked["project"].root, root, ignore=shutil.ignore_patterns("uv-cache", "docker-config", "builder"))
    shutil.copytree(REPO / "builder", root / "builder", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".gitignore", root)  # verify's scratch (build/) is not part of the committed tree
    row = _unpatched_local_row(locked, root, tmp_path / "cache")
    request, stack, inputs = row["request"], row["stack"], row["inputs"]
    # The locked image in the layout the verify's own runs read (the row's cache), as a user's would be.
    monkeypatch.setenv("BUILDER_CACHE", row["env"]["BUILDER_CACHE"])
    engine = BuildahEngine(export_to_docker=False)
    result = engine.build(request)
    try:
        records.record_build(stack.name, ImageRecord(
            image_id=result.image_id, immutable_tag=request.tags[0], tags=request.tags, inputs_hash=inputs.hash,
            base=row["resolution"].base, source_date_epoch=stack.source_date_epoch, report="", provenance="",
            engine=result.identity), smoke_report(image=result.image_id, stack=stack.name), row["lock"])
        _git(root, "init", "--quiet")
        _git(root, "add", "--all")
        _git(root, "commit", "--quiet", "-m", "the locked row")
        verify = ["verify", "--against-lock", stack.name, "--matrix", str(row["matrix"]), "--local-base"]
        # buildah stats $DOCKER_CONFIG/config.json when it saves the base: a config with no credentials.
        (tmp_path / "docker-config").mkdir()
        (tmp_path / "docker-config" / "config.json").write_text('{"auths": {}}\n')
        env = {**row["env"], "DOCKER_CONFIG": str(tmp_path / "docker-config")}
        same = run_builder(*verify, env=env, cwd=root)
        assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
        assert same.stdout.strip() == f"identical: {result.image_id}"

        dockerfile = root / "images" / stack.name / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + 'LABEL planted="yes"\n')
        tool = root / "builder/runtime/stackinfo.py"
        tool.write_text(tool.read_text() + "# planted\n")
        _git(root, "commit", "--quiet", "-am", "plant")
        planted = run_builder(*verify, env=env, cwd=root)
        assert planted.returncode == 1, planted.stdout[-3000:] + planted.stderr[-3000:]
        out = planted.stdout
        assert out.startswith(f"digests differ: {result.image_id} != sha256:")
        assert "made by: " in out and "builder/runtime/" in out.split("made by: ")[1].splitlines()[0]
        assert "  opt/builder/runtime/stackinfo.py: content" in out
        assert "config.Labels.planted" in out
        assert planted.stderr.strip().splitlines()[-1] == "builder: error: the builds differ: not reproducible"
    finally:
        engine.remove(request.tags[0])


def _fresh_build(locked, pushed_base, stack, resolution, inputs, debs, wheels, storage: Path) -> str:
    """One build of the registry row in empty buildah storage: its base pulled by digest from the loopback
    registry, then every RUN step with no network; returns the image id."""
    registry = pushed_base["registry"]
    base = f"{registry.host}/nvidia/cuda@{resolution.base.manifest_digest}"
    engine = BuildahEngine(storage_dir=storage, export_to_docker=False)
    subprocess.run([*engine._global_args(), "pull", "--quiet", "--tls-verify=false", f"docker://{base}"],
                   check=True, capture_output=True)
    context_dir = storage.parent / f"{storage.name}-context"
    dockerfile = build.stage_context(inputs, locked["project"].root, resolution, wheels, context_dir, debs)
    request = build.build_request(stack, context_dir, dockerfile, "localhost/loopback-registry-row:test", False,
                                  Progress.for_environment())
    assert request.network == "none"
    try:
        result = engine.build(request)
        with engine.mounted(request.tags[0]) as root:
            status = (root / "var/lib/dpkg/status").read_text()
            installed = {p["Package"]: p["Version"] for p in dpkg.installed(status)}
        for package in resolution.system_packages.packages:
            assert installed.get(package.name) == package.version, package.name
        return result.image_id
    finally:
        engine.reset_storage()


def test_the_registry_row_installs_its_locked_debs_and_builds_twice_to_one_id_with_no_network(
        locked, pushed_base, tmp_path):
    """The row on its registry base (the local base, pushed): `builder lock` resolved its system packages
    from Debian's archive on loopback and `builder fetch` took the .debs and wheels into an empty cache;
    built twice, each time in empty storage with no network, it holds exactly the locked packages and
    gives one image id."""
    project = locked["project"]
    matrix = project.root / "matrix-unpatched.toml"
    matrix.write_text(project.matrix.read_text().replace('patched = ["sglang", "flashinfer-python"]', "patched = []"))
    if not (project.root / "builder").exists():
        (project.root / "builder").symlink_to(REPO / "builder")
    env = {**locked["env"], "BUILDER_CACHE": str(tmp_path / "cache")}
    for command in (["lock"], ["render"], ["fetch"]):
        done = run_builder(*command, "--matrix", str(matrix), "--stack", project.stack, env=env)
        assert done.returncode == 0, (command, done.stderr)
    lock_path = project.root / "matrix.lock"
    stack = load_matrix(matrix).stack(project.stack)
    resolution = check_current(stack, lock_path).resolution
    row_debs = resolution.system_packages
    assert sorted(p.name for p in row_debs.packages) == ["jq", "libjq1", "libonig5"]  # the base has the rest
    # The lock names the archive, not the mirror (an internal one here): `fetch` found it in the matrix's sources.
    assert row_debs.archives[0].name == "debian" and locked["mirror"].uri not in lock_path.read_text()
    assert (project.root / "images" / project.stack / "debs.txt").read_text() == "".join(
        f"{p.sha256}  {p.basename}\n" for p in row_debs.packages)
    assert "apt-get" not in (project.root / "images" / project.stack / "Dockerfile").read_text()
    debs = deb_cache.DebCache(tmp_path / "cache" / "locked-debs")
    wheels = wheel_cache.WheelCache(tmp_path / "cache" / "locked-wheels")
    assert not debs.missing(row_debs)
    inputs = context.build_inputs(stack, project.root, base_pin(stack, resolution))
    ids = [_fresh_build(locked, pushed_base, stack, resolution, inputs, debs, wheels, tmp_path / name)
           for name in ("storage-1", "storage-2")]
    assert ids[0] == ids[1] and ids[0].startswith("sha256:")
