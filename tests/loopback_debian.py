"""A Debian archive on 127.0.0.1, made of real bookworm .debs, signed by a key made for the test.

    real_debs(packages) -> list[Path]     the .debs of the real local base's closure plus `packages`,
                                          fetched once through apt's default mirror into the host's
                                          content-keyed .deb cache (builder fetch's), as the files
    DebianMirror(server, signer)          an archive under <server root>/debian: .publish(debs, date)
                                          writes pool/, Packages.xz and an InRelease signed by signer;
                                          .source_line, .snapshot (a URL template under /snapshot/)
    Signer(directory)                     a throwaway GPG key (gpg --quick-generate-key): .keyring, .clearsign()
    rebuilt(deb, version, directory)      the same package under another version (dpkg-deb -R, -b)
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import subprocess
from pathlib import Path

from builder.base.local_base import DEFAULT_PACKAGES
from builder.cache.deb_cache import DebCache
from builder.config.stack import AptSpec
from builder.lock import debian_archive

SUITE = "bookworm"
ARCH = "amd64"


def real_debs(extra: tuple[str, ...] = ()) -> list[Path]:
    """The real base closure (and `extra` with its dependencies) as .deb files in the host's cache."""
    spec = AptSpec("debian", SUITE, tuple(sorted({*DEFAULT_PACKAGES, *extra})), "root")
    locked = debian_archive.resolve(spec)
    cache = DebCache()
    cache.fill(locked, "test mirror", lambda: debian_archive.fetch_sources(spec))
    return [cache.path(package) for package in locked.packages]


class Signer:
    def __init__(self, directory: Path, name: str = "builder test archive") -> None:
        self.home = directory / "gnupg"
        self.home.mkdir(parents=True, mode=0o700)
        self._gpg("--quick-generate-key", "--passphrase", "", f"{name} <archive@test.invalid>", "ed25519", "sign",
                  "never")
        self.keyring = directory / "keyring.gpg"
        self.keyring.write_bytes(self._gpg("--export"))

    def _gpg(self, *arguments: str, stdin: bytes | None = None) -> bytes:
        return subprocess.run(["gpg", "--homedir", str(self.home), "--batch", "--pinentry-mode", "loopback",
                               *arguments], input=stdin, capture_output=True, check=True).stdout

    def clearsign(self, text: bytes) -> bytes:
        return self._gpg("--clearsign", "--digest-algo", "SHA256", stdin=text)


def control(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout


class DebianMirror:
    """A one-suite archive (main, amd64) at <root>/debian, served by the LoopbackServer given."""

    def __init__(self, server, signer: Signer) -> None:
        self.server, self.signer = server, signer
        self.root = server.root / "debian"
        self.uri = f"{server.url}/debian"
        self.source_line = f"deb {self.uri} {SUITE} main"
        # Where `builder fetch` looks when the mirror lost a file: <root>/snapshot/debian/<timestamp>/.
        self.snapshot = f"{server.url}/snapshot/{{archive}}/{{timestamp}}"

    def pool_path(self, deb: Path) -> str:
        return f"pool/main/{deb.name}"

    def publish(self, debs: list[Path], date: str) -> None:
        """Exactly these files in the pool and the index, signed; whatever was there before is gone."""
        shutil.rmtree(self.root, ignore_errors=True)
        stanzas = []
        for deb in sorted(debs, key=lambda path: path.name):
            target = self.root / self.pool_path(deb)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(deb, target)
            data = target.read_bytes()
            stanzas.append(control(target).rstrip("\n") + f"\nFilename: {self.pool_path(deb)}\nSize: {len(data)}\n"
                           f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
        plain = "\n".join(stanzas).encode()
        packages = lzma.compress(plain)
        dists = self.root / "dists" / SUITE
        (dists / f"main/binary-{ARCH}").mkdir(parents=True)
        (dists / f"main/binary-{ARCH}/Packages.xz").write_bytes(packages)
        release = (f"Origin: Debian\nLabel: Debian\nSuite: {SUITE}\nCodename: {SUITE}\nDate: {date}\n"
                   f"Architectures: {ARCH}\nComponents: main\nSHA256:\n"
                   f" {hashlib.sha256(plain).hexdigest()} {len(plain)} main/binary-{ARCH}/Packages\n"
                   f" {hashlib.sha256(packages).hexdigest()} {len(packages)} main/binary-{ARCH}/Packages.xz\n")
        (dists / "InRelease").write_bytes(self.signer.clearsign(release.encode()))

    def keep_in_snapshot(self, deb: Path, timestamp: str) -> Path:
        """The file as the snapshot archive of the state at `timestamp` serves it."""
        target = self.server.root / "snapshot" / "debian" / timestamp / self.pool_path(deb)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(deb, target)
        return target


def rebuilt(deb: Path, version: str, directory: Path) -> Path:
    """The package of `deb` with another version (its files unchanged but for a marker), as a new upload."""
    directory.mkdir(parents=True, exist_ok=True)
    tree = directory / f"{deb.stem}-tree"
    subprocess.run(["dpkg-deb", "--raw-extract", str(deb), str(tree)], check=True)
    control_file = tree / "DEBIAN" / "control"
    lines = [f"Version: {version}" if line.startswith("Version:") else line
             for line in control_file.read_text().splitlines()]
    control_file.write_text("\n".join(lines) + "\n")
    fields = dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith(" "))
    output = directory / f"{fields['Package']}_{version.split(':')[-1]}_{fields['Architecture']}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(output)], check=True,
                   capture_output=True)
    return output
