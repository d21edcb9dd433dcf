"""`builder base`: a minimal Debian base image made locally with mmdebstrap, bit-for-bit reproducible.

No registry can be pulled here (nor on air-gapped hosts), so every stack can build FROM this image.

Steps:
1. The .deb files matrix.lock records for the base (`builder lock`, builder/lock/debian_archive.py:
   exactly the set mmdebstrap --variant=apt installs with these packages) are fetched into the host's
   content-keyed cache (builder/cache/deb_cache.py) unless already there, and hard-linked into a local
   apt repository whose Packages file is written from the files themselves.
2. mmdebstrap writes the root filesystem as a tar from that repository alone, in a network namespace
   with no interfaces (`unshare --net`): nothing can come from anywhere else. With SOURCE_DATE_EPOCH
   set it is reproducible (file times clamped, logs and caches removed); /etc/hostname and
   /etc/resolv.conf, copied from the host, are removed so other hosts agree, and /etc/apt/sources.list
   names the archive the lock was made from, never the local repository's path.
3. That tar becomes the image's only layer, as-is, in a docker-archive written here with a config
   whose every field is fixed (created = SOURCE_DATE_EPOCH). Importing with `docker import` or
   `buildah from scratch` + commit would stamp the wall clock or re-pack the files; loading an archive
   we wrote keeps the config byte-exact, so the image ID (the digest) is the same in every engine.
4. The archive is loaded into the engine; the image ID is printed and returned for the lock.

So the digest holds on any day, whatever the mirror serves now: a moved archive changes the base only
through `builder lock`, which says which packages moved.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from builder.base import dpkg
from builder.cache.deb_cache import DebCache
from builder.engine.protocol import Engine
from builder.errors import BuildFailure, UserError
from builder.files import sha256_file
from builder.lock.debian_archive import mirror_for
from builder.lock.system_packages import SystemPackages
from builder.paths import local_base_tag

# Runtime needs of a CUDA Python stack on top of Debian's python3: the CUDA user-space libraries come
# from the pip wheels (nvidia-*), the driver from the host; these are what those wheels link against.
DEFAULT_PACKAGES = (
    "ca-certificates",  # TLS to package indexes (plus a build-time CA secret where a host needs one)
    "libgomp1",  # OpenMP runtime: torch
    "libnuma1",  # NUMA: sgl-kernel, NCCL topology
    "libstdc++6",
    "patch",  # the patch series is applied inside the build
    "procps",  # ps/pkill: clearing stale server processes
    "python3",
    "python3-venv",
)
# Documentation and translations are not needed to serve; licence texts (copyright) stay.
_DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/lintian/*",
)
_MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
_IMAGE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BaseSpec:
    source_date_epoch: int
    suite: str = "bookworm"
    architecture: str = "amd64"
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    tag: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", tuple(sorted(set(self.packages))))
        if not self.tag:
            object.__setattr__(self, "tag", local_base_tag(self.suite))


@dataclass(frozen=True)
class BaseResult:
    image_id: str  # the digest: sha256 of the image config
    tag: str
    archive: Path  # docker-archive, loadable by `docker load` and `buildah pull docker-archive:`
    rootfs_sha256: str  # the layer's diff_id; equal tarballs have equal values
    rootfs_bytes: int
    packages: tuple[str, ...] = field(default=())  # "name=version", sorted
    mmdebstrap_s: float = 0.0


def mmdebstrap_environment(source_date_epoch: int) -> dict[str, str]:
    """mmdebstrap's whole environment, which its maintainer scripts inherit: nothing of the caller's. A
    Python that a script imports must not leave bytecode of its own (marshal's bytes depend on the
    importing process; a host that sets PYTHONDONTWRITEBYTECODE gave another base than one that does
    not): each .pyc is the one py3compile writes."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "SOURCE_DATE_EPOCH": str(source_date_epoch)}


def mmdebstrap_command(spec: BaseSpec, output: Path, repository: Path, sources_list: Path) -> list[str]:
    """mmdebstrap from the local repository only, in a network namespace with no interfaces."""
    command = [
        "unshare", "--net", "--",
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        "--format=tar",
        f"--architectures={spec.architecture}",
        "--aptopt=APT::Install-Recommends \"false\"",
        f"--include={','.join(spec.packages)}",
    ]
    # Merge /usr with mmdebstrap's hook instead of the usrmerge package (which pulls in all of perl).
    if _MERGED_USR_HOOKS.is_dir():
        command.append(f"--hook-dir={_MERGED_USR_HOOKS}")
    command += [f"--dpkgopt={option}" for option in _DPKG_EXCLUDES]
    # A fixed hook (no user input): these two files are copied from the host and differ per host.
    command.append('--customize-hook=rm -f "$1/etc/hostname" "$1/etc/resolv.conf"')
    command.append(f"--customize-hook=upload {sources_list} /etc/apt/sources.list")
    command += [spec.suite, str(output), f"deb [trusted=yes] copy://{repository} {spec.suite} main"]
    return command


def local_repository(spec: BaseSpec, locked: SystemPackages, cache: DebCache, directory: Path) -> Path:
    """An apt repository holding exactly the locked files (hard links from the cache), its Packages file
    written from each file's own control fields plus its name, size and sha256, in name order."""
    pool = directory / "pool"
    cache.link_into(locked, pool)
    stanzas = []
    for package in locked.packages:
        deb = pool / package.basename
        control = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout
        stanzas.append(control.rstrip("\n") + f"\nFilename: pool/{package.basename}\nSize: {package.size}\n"
                       f"SHA256: {package.sha256}\n")
    binary = f"main/binary-{spec.architecture}"
    packages = ("\n".join(stanzas)).encode()
    (directory / "dists" / spec.suite / binary).mkdir(parents=True)
    (directory / "dists" / spec.suite / binary / "Packages").write_bytes(packages)
    release = (f"Suite: {spec.suite}\nCodename: {spec.suite}\nArchitectures: {spec.architecture}\n"
               f"Components: main\nSHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} {binary}/Packages\n")
    (directory / "dists" / spec.suite / "Release").write_text(release)
    return directory


def apt_sources(locked: SystemPackages, source_lines: tuple[str, ...]) -> list[str]:
    """The base's /etc/apt/sources.list: each locked archive from the mirror apt's configuration names for
    it (the lock names none), else its snapshot."""
    lines = []
    for archive in locked.archives:
        uri = mirror_for(archive, source_lines) or archive.snapshot
        if not uri:
            raise UserError(f"no apt source serves {archive.name} {archive.suite}, and it has no snapshot "
                            f"archive: name one in the matrix's `sources`")
        lines.append(archive.source_line(uri))
    return lines


def build_rootfs(
    spec: BaseSpec, output: Path, locked: SystemPackages, cache: DebCache, source_lines: tuple[str, ...] = (),
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Run mmdebstrap into `output` from the locked .debs; the file appears only when complete (Ctrl-C
    leaves none)."""
    if shutil.which("mmdebstrap") is None:
        raise UserError("mmdebstrap not found: run scripts/setup-host (or apt-get install mmdebstrap)")
    if os.geteuid() != 0:
        raise UserError("builder base needs root (mmdebstrap --mode=root): run it as root")
    partial = output.with_name(output.name + ".partial")
    env = mmdebstrap_environment(spec.source_date_epoch)
    tail: list[str] = []
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".repository-") as scratch:
        repository = local_repository(spec, locked, cache, Path(scratch) / "repo")
        sources_list = Path(scratch) / "sources.list"
        sources_list.write_text("".join(f"{line}\n" for line in apt_sources(locked, source_lines)))
        try:
            with subprocess.Popen(
                mmdebstrap_command(spec, partial, repository, sources_list),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            ) as process:
                assert process.stdout is not None
                for line in process.stdout:
                    tail = (tail + [line.rstrip()])[-8:]
                    if on_line:
                        on_line(line.rstrip())
            if process.returncode != 0:
                details = "\n".join(f"  | {line}" for line in tail)
                raise BuildFailure(f"mmdebstrap failed (exit status {process.returncode}):\n{details}")
            partial.replace(output)
        finally:
            partial.unlink(missing_ok=True)


def check_locked(spec: BaseSpec, locked: SystemPackages | None) -> SystemPackages:
    """The lock's packages for this base, refusing none or ones resolved for another package list."""
    if locked is None:
        raise UserError("matrix.lock records no system packages for the local base: run `builder lock`")
    if locked.scope != "root" or tuple(sorted(locked.requested)) != spec.packages:
        raise UserError(f"matrix.lock's base packages were resolved for {', '.join(locked.requested)}, the matrix "
                        f"asks for {', '.join(spec.packages)}: run `builder lock`")
    return locked


def check_installed(locked: SystemPackages, installed: tuple[str, ...]) -> None:
    """mmdebstrap must have installed exactly the locked set: a difference is a resolver bug."""
    expected = {package.pin for package in locked.packages}
    if set(installed) != expected:
        extra, absent = sorted(set(installed) - expected), sorted(expected - set(installed))
        raise BuildFailure(f"the base holds other packages than matrix.lock records (installed but not locked: "
                           f"{', '.join(extra) or 'none'}; locked but not installed: {', '.join(absent) or 'none'})")


def installed_packages(rootfs_tar: Path) -> tuple[str, ...]:
    """"name=version" of every package in the tarball's dpkg status, sorted."""
    with tarfile.open(rootfs_tar) as archive:
        member = archive.extractfile("./var/lib/dpkg/status")
        if member is None:
            raise BuildFailure(f"{rootfs_tar}: no dpkg status file: not a Debian root filesystem")
        status = member.read().decode()
    return tuple(sorted(f"{fields['Package']}={fields['Version']}" for fields in dpkg.installed(status)))


def _iso_time(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def image_config(spec: BaseSpec, diff_id: str) -> bytes:
    """The image config, canonical JSON: its sha256 is the image ID."""
    created = _iso_time(spec.source_date_epoch)
    config = {
        "architecture": spec.architecture,
        "os": "linux",
        "created": created,
        "config": {
            "Env": list(_IMAGE_ENV),
            "Cmd": ["/bin/bash"],
            "Labels": {
                "org.opencontainers.image.created": created,
                "org.opencontainers.image.title": "builder base",
                "org.opencontainers.image.base.name": f"debian:{spec.suite}",
                "builder.base.packages": ",".join(spec.packages),
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [
            {
                "created": created,
                "created_by": f"mmdebstrap --variant=apt {spec.suite} "
                f"--include={','.join(spec.packages)}",
            }
        ],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def write_image_archive(spec: BaseSpec, rootfs_tar: Path, diff_id: str, archive_path: Path) -> str:
    """Write a docker-archive holding rootfs_tar as its one layer; return the image ID."""
    config = image_config(spec, diff_id)
    config_hex = hashlib.sha256(config).hexdigest()
    layer_name = f"{diff_id}/layer.tar"
    manifest = [
        {"Config": f"{config_hex}.json", "RepoTags": [spec.tag], "Layers": [layer_name]}
    ]
    partial = archive_path.with_name(archive_path.name + ".partial")
    try:
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            _add_bytes(archive, f"{config_hex}.json", config, spec.source_date_epoch)
            layer = archive.gettarinfo(str(rootfs_tar), arcname=layer_name)
            layer.mtime, layer.uid, layer.gid, layer.uname, layer.gname = (
                spec.source_date_epoch, 0, 0, "", "")
            with rootfs_tar.open("rb") as stream:
                archive.addfile(layer, stream)
            manifest_json = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
            _add_bytes(archive, "manifest.json", manifest_json, spec.source_date_epoch)
        partial.replace(archive_path)
    finally:
        partial.unlink(missing_ok=True)
    return f"sha256:{config_hex}"


def make_base(
    spec: BaseSpec,
    output_dir: Path,
    locked: SystemPackages,
    cache: DebCache,
    engine: Engine | None = None,
    check_reproducible: bool = False,
    on_line: Callable[[str], None] | None = None,
    sources: Callable[[], tuple[str, ...]] = tuple,
) -> BaseResult:
    """Build the base from the locked .debs (twice when check_reproducible), write it to output_dir, load it
    into engine. The cache gets the .debs it lacks first."""
    output_dir = Path(output_dir).resolve()  # apt reads the local repository by an absolute copy:// URL
    output_dir.mkdir(parents=True, exist_ok=True)
    source_lines = sources()
    cache.fill(locked, "base", lambda: source_lines)
    stem = f"base-{spec.suite}-{spec.architecture}"
    archive_path = output_dir / f"{stem}.docker.tar"
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs.tar"
        started = time.monotonic()
        build_rootfs(spec, rootfs, locked, cache, source_lines, on_line)
        mmdebstrap_s = time.monotonic() - started
        diff_id = sha256_file(rootfs)
        if check_reproducible:
            again = Path(scratch) / "rootfs-again.tar"
            build_rootfs(spec, again, locked, cache, source_lines, on_line)
            again_id = sha256_file(again)
            if again_id != diff_id:
                raise BuildFailure(
                    f"base root filesystem is not reproducible: two mmdebstrap runs gave "
                    f"sha256:{diff_id[:12]} and sha256:{again_id[:12]} (compare them with diffoscope)"
                )
            again.unlink()
        packages = installed_packages(rootfs)
        check_installed(locked, packages)
        image_id = write_image_archive(spec, rootfs, diff_id, archive_path)
        result = BaseResult(
            image_id=image_id,
            tag=spec.tag,
            archive=archive_path,
            rootfs_sha256=f"sha256:{diff_id}",
            rootfs_bytes=rootfs.stat().st_size,
            packages=packages,
            mmdebstrap_s=round(mmdebstrap_s, 1),
        )
    (output_dir / f"{stem}.packages.txt").write_text("".join(f"{p}\n" for p in packages))
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}
    record.pop("packages")
    record.pop("mmdebstrap_s")  # a duration: kept out of the record that is compared across runs
    record["source_date_epoch"] = spec.source_date_epoch
    record["suite"] = spec.suite
    (output_dir / f"{stem}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if engine is not None:
        loaded = engine.load(archive_path)
        if loaded != image_id:
            raise BuildFailure(
                f"{engine.name} loaded the base as {loaded}, expected {image_id}: the engine "
                "rewrote the image config"
            )
    return result
