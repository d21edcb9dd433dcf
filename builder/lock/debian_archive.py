"""System packages locked like wheels: an apt archive's signed index, read and resolved to exact files.

`builder lock` gives every row the .deb files its system packages come from, each by name, version,
architecture, size and sha256, with their whole dependency closure and the archive state they were
read from (the archive's name, suite and components, InRelease date and sha256, and the
snapshot-archive URL of that state; never the mirror that served it, which `builder fetch` takes
from apt's configuration: the matrix's `sources`, else mmdebstrap's defaults):

1. Each source's InRelease is downloaded and verified with gpgv against the distribution's keyring
   (builder/config/apt_archives.toml, or the matrix's `keyring`); only the text gpgv vouches for is
   read. Each Packages.xz must match the size and sha256 that text lists.
2. apt itself resolves the closure, from exactly those verified files (copied into a throwaway apt
   root that verifies the signature a second time), the way mmdebstrap --variant=apt does:
   `dist-upgrade` on an empty dpkg status (Essential:yes packages and apt, which apt treats as
   essential), then `install` of the requested packages (plus usr-is-merged, which mmdebstrap's
   merged-usr hook installs) on top of that. For a registry base the set a base image already holds
   (Essential:yes, Priority: required, apt) is taken as installed and left out: the row's dpkg step
   fails loudly if the base lacks one.

Where no source lines are named, they are the ones mmdebstrap uses for the suite, asked from
mmdebstrap at run time (a setup hook copies its sources.list out; nothing is downloaded).
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import lzma
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder.config.stack import AptSpec
from builder.engine import host_network
from builder.errors import BuildFailure, UserError
from builder.lock.system_packages import DebArchive, DebPackage, SystemPackages, archive_name

_ARCHIVES_DATA = Path(__file__).resolve().parent.parent / "config" / "apt_archives.toml"
_TIMEOUT_S = 60
_RESYNC_WAIT_S = 5  # a mirror sync replaces the files a few seconds apart
# mmdebstrap's merged-usr hook installs this in its essential phase (builder base uses that hook).
MERGED_USR_PACKAGE = "usr-is-merged"


# --- sources and distributions -------------------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    uri: str
    suite: str
    components: tuple[str, ...]

    @classmethod
    def parse(cls, line: str) -> "AptSource":
        fields = line.split()
        if len(fields) < 4 or fields[0] != "deb" or fields[2].endswith("/") or fields[1].startswith("["):
            raise UserError(f"apt source {line!r}: expected 'deb URI SUITE COMPONENT...' (no options, no flat "
                            f"repositories)")
        return cls(fields[1].rstrip("/"), fields[2], tuple(fields[3:]))

    def url(self, path: str) -> str:
        return f"{self.uri}/{path}"


@dataclass(frozen=True)
class Distribution:
    keyring: Path
    snapshot: str  # URL template with {archive} (the mirror's last path part) and {timestamp}; "" for none

    def snapshot_url(self, uri: str, date: str) -> str:
        if not self.snapshot:
            return ""
        when = email.utils.parsedate_to_datetime(date).astimezone(datetime.timezone.utc)
        return self.snapshot.format(archive=archive_name(uri), timestamp=when.strftime("%Y%m%dT%H%M%SZ"))


def distribution(spec: AptSpec) -> Distribution:
    """The keyring and snapshot archive of the spec's distribution (the data file), as the matrix
    overrides them."""
    known = tomllib.loads(_ARCHIVES_DATA.read_text(encoding="utf-8"))
    facts = known.get(spec.distribution)
    if facts is None:
        raise UserError(f"distribution {spec.distribution!r} is not in {_ARCHIVES_DATA.name} "
                        f"(known: {', '.join(sorted(known))})")
    keyring = Path(spec.keyring or facts["keyring"])
    if not keyring.is_file():
        raise UserError(f"{keyring}: the {spec.distribution} archive keyring is missing (install the "
                        f"distribution's keyring package, or name one with `keyring`)")
    snapshot = facts.get("snapshot", "") if spec.snapshot is None else spec.snapshot
    return Distribution(keyring, snapshot)


def default_sources(suite: str) -> tuple[str, ...]:
    """The source lines mmdebstrap uses for the suite when given no mirror: its own sources.list,
    copied out by a setup hook of a run that downloads and installs nothing."""
    if shutil.which("mmdebstrap") is None:
        raise UserError("mmdebstrap not found (it names the default mirror): run scripts/setup-host, or name "
                        "the archive's `sources` in matrix.toml")
    mode = "root" if os.geteuid() == 0 else "chrootless"  # chrootless needs no user namespace
    with tempfile.TemporaryDirectory(prefix="builder-sources-") as scratch:
        command = ["mmdebstrap", f"--mode={mode}", "--variant=custom", "--skip=update,download/empty,cleanup",
                   "--format=null", f"--setup-hook=copy-out /etc/apt/sources.list {scratch}", suite, "/dev/null"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        listing = Path(scratch) / "sources.list"
        if result.returncode != 0 or not listing.is_file():
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"mmdebstrap could not name the default sources of {suite!r}: {tail}")
        lines = [line.strip() for line in listing.read_text().splitlines()]
    return tuple(line for line in lines if line.startswith("deb "))


# --- the signed index ----------------------------------------------------------------------------


def _get(url: str) -> bytes:
    context = None
    bundle = host_network.ca_bundle()
    if url.startswith("https:") and bundle is not None:
        context = ssl.create_default_context(cafile=str(bundle))
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S, context=context) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise UserError(f"{url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(f"{url}: unreachable ({reason})") from None


def verified_release(signed: bytes, keyring: Path, where: str) -> str:
    """The text of an InRelease that gpgv verifies with the keyring; one line naming it otherwise."""
    with tempfile.TemporaryDirectory(prefix="builder-inrelease-") as scratch:
        source, text = Path(scratch) / "InRelease", Path(scratch) / "Release"
        source.write_bytes(signed)
        result = subprocess.run(["gpgv", "--keyring", str(keyring.resolve()), "--output", str(text), str(source)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            said = [line.removeprefix("gpgv: ") for line in result.stderr.splitlines()
                    if "BAD" in line or "No public key" in line or "no valid OpenPGP" in line or "verify" in line]
            raise UserError(f"{where}: signature refused by gpgv with {keyring} ({(said or ['no good signature'])[-1]})")
        return text.read_text(encoding="utf-8")


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """deb822 stanzas (Packages, Release): continuation lines are kept as they are (with their leading
    space), so a stanza written back is the same stanza."""
    stanzas, current, key = [], {}, None
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line[0] in " \t" and key is not None:
            current[key] += "\n" + line.rstrip()
        elif ":" in line:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def _release_files(release: dict[str, str]) -> dict[str, tuple[int, str]]:
    """{path: (size, sha256)} of the SHA256 list."""
    files = {}
    for line in release.get("SHA256", "").splitlines():
        fields = line.split()
        if len(fields) == 3:
            files[fields[2]] = (int(fields[1]), fields[0])
    return files


@dataclass(frozen=True)
class SourceIndex:
    """One source's verified index: the InRelease bytes and each Packages.xz, with their stanzas."""

    source: AptSource
    inrelease: bytes
    date: str
    packages_xz: dict[str, bytes]  # release-relative path -> bytes
    stanzas: dict[str, dict[str, str]]  # Filename -> stanza


class _IndexMismatch(UserError):
    """A Packages file that is not the one the signed InRelease lists."""


def read_source(source: AptSource, keyring: Path, architecture: str) -> SourceIndex:
    """The source's signed InRelease and the Packages files it lists. A mirror replaces its files one
    by one while it syncs, so a mismatch is read once more, InRelease first; a second one is refused."""
    try:
        return _read_source(source, keyring, architecture)
    except _IndexMismatch:
        time.sleep(_RESYNC_WAIT_S)
        return _read_source(source, keyring, architecture)


def _read_source(source: AptSource, keyring: Path, architecture: str) -> SourceIndex:
    where = f"{source.uri} {source.suite}"
    inrelease = _get(source.url(f"dists/{source.suite}/InRelease"))
    fields = (parse_stanzas(verified_release(inrelease, keyring, f"InRelease of {where}")) or [{}])[0]
    listed = _release_files(fields)
    packages_xz, stanzas = {}, {}
    for component in source.components:
        path = f"{component}/binary-{architecture}/Packages.xz"
        if path not in listed:
            raise UserError(f"{where}: its InRelease lists no {path}")
        data = _get(source.url(f"dists/{source.suite}/{path}"))
        size, sha256 = listed[path]
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise _IndexMismatch(f"{where}: {path} does not match the sha256 its signed InRelease lists; refused")
        packages_xz[path] = data
        for stanza in parse_stanzas(lzma.decompress(data).decode("utf-8")):
            stanzas[stanza["Filename"]] = stanza
    if "Date" not in fields:
        raise UserError(f"{where}: its InRelease has no Date")
    return SourceIndex(source, inrelease, fields["Date"], packages_xz, stanzas)


# --- resolution (apt, in a throwaway root) --------------------------------------------------------


class _AptRoot:
    """An apt configuration of its own: the verified indexes as file repositories, an explicit dpkg
    status, nothing read from the host's apt setup."""

    def __init__(self, root: Path, indexes: list[SourceIndex], keyring: Path, architecture: str) -> None:
        self.root, self.indexes = root, indexes
        for directory in ("etc/apt/apt.conf.d", "etc/apt/sources.list.d", "etc/apt/preferences.d",
                          "etc/apt/trusted.gpg.d", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial",
                          "var/lib/dpkg", "repos"):
            (root / directory).mkdir(parents=True, exist_ok=True)
        lines = []
        for number, index in enumerate(indexes):
            repo = root / "repos" / str(number)
            dists = repo / "dists" / index.source.suite
            dists.mkdir(parents=True)
            (dists / "InRelease").write_bytes(index.inrelease)
            for path, data in index.packages_xz.items():
                (dists / path).parent.mkdir(parents=True, exist_ok=True)
                (dists / path).write_bytes(data)
            lines.append(f"deb [signed-by={keyring.resolve()}] copy:{repo} {index.source.suite} "
                         f"{' '.join(index.source.components)}")
        (root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
        self.config = root / "apt.conf"
        self.config.write_text("\n".join([
            f'Dir "{root}/";',
            f'Dir::State::status "{root}/var/lib/dpkg/status";',
            f'APT::Architecture "{architecture}";',
            f'APT::Architectures "{architecture}";',
            'APT::Install-Recommends "false";',
            'APT::Sandbox::User "root";',
            'Acquire::Languages "none";',
            'Acquire::By-Hash "no";',
            'Debug::NoLocking "true";',
            "",
        ]))
        self.set_status([])

    def set_status(self, stanzas: list[dict[str, str]]) -> None:
        blocks = []
        for stanza in stanzas:
            fields = {k: v for k, v in stanza.items() if k not in ("Filename", "Size", "SHA256", "MD5sum",
                                                                  "Description-md5")}
            fields["Status"] = "install ok installed"
            blocks.append("".join(f"{k}: {v}\n" for k, v in fields.items()))
        (self.root / "var/lib/dpkg/status").write_text("\n".join(blocks))

    def run(self, *arguments: str) -> str:
        env = {"APT_CONFIG": str(self.config), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        result = subprocess.run(["apt-get", "-q", *arguments], capture_output=True, text=True, env=env, check=False)
        if arguments == ("update",) and result.returncode == 0:
            return result.stdout + result.stderr
        if result.returncode != 0:
            said = [line for line in (result.stderr + result.stdout).splitlines() if line.startswith("E:")]
            raise UserError(f"apt could not resolve {' '.join(arguments[-3:])}: "
                            f"{(said or [f'exit status {result.returncode}'])[0]}")
        return result.stdout

    def update(self) -> None:
        """Read the copied indexes; apt only warns about one it could not use, which is an error here."""
        output = self.run("update")
        problems = [line for line in output.splitlines() if line.startswith(("W:", "E:", "Err:"))]
        if problems:
            raise UserError(f"apt could not read the verified index: {problems[0]}")

    def to_download(self, *arguments: str) -> list[tuple[int, dict[str, str]]]:
        """(index number, stanza) of each file apt would fetch for these arguments."""
        chosen = []
        for line in self.run("--print-uris", "--yes", *arguments).splitlines():
            if not line.startswith("'copy:"):
                continue
            path = Path(urllib.parse.unquote(line.split("'")[1].removeprefix("copy:")))
            number = path.relative_to(self.root / "repos").parts[0]
            filename = path.relative_to(self.root / "repos" / number).as_posix()
            stanza = self.indexes[int(number)].stanzas.get(filename)
            if stanza is None:
                raise BuildFailure(f"apt chose {filename}, which the verified index does not list")
            chosen.append((int(number), stanza))
        return chosen


# The placeholder mmdebstrap's merged-usr setup hook installs before apt resolves anything, so that
# init-system-helpers' "usrmerge | usr-is-merged" does not pull in usrmerge (and perl).
_DUMMY_MERGED_USR = {"Package": MERGED_USR_PACKAGE, "Version": "1", "Architecture": "all", "Multi-Arch": "foreign"}


def _base_pattern(architecture: str) -> str:
    return f"?narrow(?architecture({architecture}),?or(?essential,?priority(required)))"


def resolve(spec: AptSpec) -> SystemPackages:
    """Lock the spec's packages (see the module's docstring); one line naming what failed otherwise."""
    facts = distribution(spec)
    lines = spec.sources or default_sources(spec.suite)
    indexes = [read_source(AptSource.parse(line), facts.keyring, spec.architecture) for line in lines]
    with tempfile.TemporaryDirectory(prefix="builder-apt-") as scratch:
        apt = _AptRoot(Path(scratch), indexes, facts.keyring, spec.architecture)
        apt.update()
        if spec.scope == "root":  # as mmdebstrap's merged-usr setup hook leaves the status
            apt.set_status([_DUMMY_MERGED_USR])
        base = apt.to_download("dist-upgrade")  # Essential:yes and apt, as mmdebstrap --variant=apt
        apt.set_status([stanza for _, stanza in base])
        if spec.scope == "added":  # and what a base image holds besides
            base += apt.to_download("install", _base_pattern(spec.architecture))
            apt.set_status([stanza for _, stanza in base])
        wanted = list(spec.packages) + ([MERGED_USR_PACKAGE] if spec.scope == "root" else [])
        added = apt.to_download("install", *wanted) if wanted else []
    chosen = (base + added) if spec.scope == "root" else added
    archives = tuple(DebArchive(archive_name(index.source.uri), index.source.suite, index.source.components,
                                index.date, facts.snapshot_url(index.source.uri, index.date),
                                hashlib.sha256(index.inrelease).hexdigest()) for index in indexes)
    packages = {}
    for number, stanza in chosen:
        package = DebPackage(stanza["Package"], stanza["Version"], stanza["Architecture"], stanza["Filename"],
                             int(stanza["Size"]), stanza["SHA256"], number)
        packages[package.name] = package  # an upgrade of a base package replaces it
    return SystemPackages(spec.distribution, spec.architecture, spec.scope, tuple(spec.packages), archives,
                          tuple(packages[name] for name in sorted(packages)))


# --- where the locked archives are fetched from ----------------------------------------------------


def fetch_sources(spec: AptSpec) -> tuple[str, ...]:
    """The apt source lines a fetch reads the locked .debs from: the matrix's `sources`, else
    mmdebstrap's defaults for the suite; none when mmdebstrap is not here (the snapshot archive serves)."""
    if spec.sources:
        return spec.sources
    try:
        return default_sources(spec.suite)
    except UserError:
        return ()


def mirror_for(archive: DebArchive, source_lines: tuple[str, ...]) -> str | None:
    """The URI of the source line that serves `archive` (its name and suite), if one does."""
    for line in source_lines:
        source = AptSource.parse(line)
        if archive_name(source.uri) == archive.name and source.suite == archive.suite:
            return source.uri
    return None
