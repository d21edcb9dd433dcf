"""Resolve a stack's pins to its full dependency closure, every wheel hashed, with `uv pip compile`.

Two uv passes over the same inputs:
  1. pylock.toml format: the resolution and, per distribution, the wheels that fit the target
     (python, platform) with their sha256;
  2. requirements.txt format, constrained to pass 1's exact versions: the `# via` graph that puts
     each distribution in an install group, and the `# from` index each came from.
The stack's declared overrides go to uv as `--override`, so a pinned version beats a contradicting
requirement (sglang's flashinfer==0.6.3) only where the matrix says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests
from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.errors import BuildFailure, UserError
from builder.config import compat
from builder.config.stack import GROUP_ORDER, PACKAGE_GROUPS, Stack
from builder.lock.model import DEFAULT_INDEX, Distribution

# Wheels must run on every base: manylinux_2_28 (glibc 2.28) is older than the glibc of Ubuntu
# 24.04 (CUDA bases) and Debian bookworm (local base), and it is what torch's wheels are tagged.
PLATFORM = "x86_64-manylinux_2_28"
_GLIBC_MINOR = 28
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
REACH_TIMEOUT_S = 20


@dataclass(frozen=True)
class WheelResolution:
    """What uv resolved a stack's pins to (the lock's Resolution adds the base and the matrix inputs)."""

    python: str
    platform: str
    indexes: tuple[str, ...]  # extra indexes, in matrix order; pip's default index stays default
    index_strategy: str  # uv's --index-strategy the resolution (and the install) needs
    distributions: tuple[Distribution, ...]  # sorted by name


def resolve(stack: Stack, uv: str | None = None) -> WheelResolution:
    """The stack's pins resolved for its python on PLATFORM; UserError when a source is unreachable."""
    uv = uv or _uv_binary()
    platform = platform_for(stack)
    indexes = _extra_indexes(stack)
    check_sources_reachable(stack)
    strategy = index_strategy(indexes)
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        work = Path(tmp)
        requirements = work / "requirements.in"
        requirements.write_text("".join(p.requirement + "\n" for p in stack.packages))
        overrides = work / "overrides.txt"
        overrides.write_text("".join(_override_requirement(stack, o.package) + "\n" for o in stack.overrides))
        common = [
            "--python-version", stack.python,
            "--python-platform", platform,
            "--override", str(overrides),
            "--no-build",  # wheels only: nothing is compiled inside an image
            "--no-config",  # a uv.toml on the host must not change the lock
            "--no-python-downloads",
            "--index-strategy", strategy,
        ]
        for index in indexes:
            common += ["--extra-index-url", index]
        if not os.environ.get("SSL_CERT_FILE"):
            common.append("--native-tls")  # the host's CA store, where no bundle is named

        wheels, graph_text = _pins_and_graph(stack, uv, requirements, common, platform, work)
    entries = parse_annotated(graph_text)
    return _assemble(stack, indexes, strategy, wheels, entries, platform)


# An index's pages can change between uv's two passes (a mirror or CDN edge answering with an older
# page): the second then finds no version the first pinned. Both passes run once more before giving up.
RESOLVE_ATTEMPTS = 2


def _pins_and_graph(stack: Stack, uv: str, requirements: Path, common: list[str], platform: str,
                    work: Path) -> tuple[dict[str, tuple[str, list[tuple[str, str]]]], str]:
    """uv's pins with their wheel files (pylock.toml), then the annotated graph of those same pins."""
    pylock = work / "pylock.toml"
    constraints = work / "constraints.txt"
    url_names = {p.name for p in stack.packages if p.url}
    for _ in range(RESOLVE_ATTEMPTS):
        _run_uv(stack, [uv, "pip", "compile", str(requirements), "--format", "pylock.toml",
                        "-o", str(pylock), "--quiet", *common])
        wheels = _wheels_from_pylock(tomllib.loads(pylock.read_text()), platform)
        constraints.write_text("".join(
            f"{name}=={version}\n" for name, (version, _) in sorted(wheels.items()) if name not in url_names
        ))
        try:
            return wheels, _run_uv(stack, [uv, "pip", "compile", str(requirements), "-c", str(constraints),
                                          "--emit-index-annotation", "--no-header", *common])
        except UserError as error:
            graph_error = error
    raise UserError(f"{graph_error} (the index's answer changed between two reads, {RESOLVE_ATTEMPTS} times: "
                    "a mirror mid-sync? try again later)")


def platform_for(stack: Stack) -> str:
    """PLATFORM, or a newer manylinux where a pinned wheel needs it (builder/config/compat.py)."""
    return f"x86_64-manylinux_2_{compat.resolver_glibc_minor(stack, _GLIBC_MINOR)}"


def index_strategy(indexes: tuple[str, ...]) -> str:
    """uv's default (first index holding a name wins) unless there are extra indexes: PyTorch's and
    FlashInfer's mirror common packages (numpy, jinja2, ...) at a few versions only, and first-index
    would take those. Every file is hashed, so best-match cannot slip in an unexpected file."""
    return "unsafe-best-match" if indexes else "first-index"


def check_sources_reachable(stack: Stack) -> None:
    """Fail before resolving, with one line naming every extra index or wheel URL that cannot be
    reached: uv would report only the first, deep in a cause chain, or quietly try other indexes."""
    failures: list[str] = []
    checked: set[str] = set()
    for package in stack.packages:
        if package.url:
            target, what = package.url, f"wheel URL {package.url}"
        elif package.index:
            target, what = f"{package.index.rstrip('/')}/{package.name}/", f"package index {package.index}"
        else:
            continue
        if what in checked:  # one probe per index: its first package's page
            continue
        checked.add(what)
        try:
            response = requests.head(target, timeout=REACH_TIMEOUT_S, allow_redirects=True)
        except requests.RequestException as error:
            failures.append(f"cannot reach {what} ({_network_reason(error)})")
            continue
        if response.status_code >= 500:
            failures.append(f"{what} answered HTTP {response.status_code}")
    if failures:
        raise UserError(f"{stack.name}: {'; '.join(failures)}; nothing was locked")


def _network_reason(error: requests.RequestException) -> str:
    text = str(error)
    for needle, reason in (
        ("NameResolutionError", "host name does not resolve"),
        ("Name or service not known", "host name does not resolve"),
        ("Connection refused", "connection refused"),
        ("CERTIFICATE_VERIFY_FAILED", "TLS certificate not trusted"),
    ):
        if needle in text:
            return reason
    if isinstance(error, requests.Timeout):
        return f"no answer within {REACH_TIMEOUT_S} s"
    return type(error).__name__


def _extra_indexes(stack: Stack) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for package in stack.packages:
        if package.index:
            seen.setdefault(package.index, None)
    return tuple(seen)


def _override_requirement(stack: Stack, name: str) -> str:
    package = stack.package(name)
    if package is None:
        raise UserError(f"{stack.name}: override for {name}, which the stack does not pin")
    return package.requirement


def _uv_binary() -> str:
    """uv's path, looked up only when a resolution needs it: the CLI imports this module for every
    command, and all but the resolving ones work where uv is not installed."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise UserError("resolving a stack's pins needs uv, which is not installed here (pip install uv)") from None


def _run_uv(stack: Stack, argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: install uv (pip install uv)") from None
    if result.returncode != 0:
        raise _uv_error(stack, result.stderr)
    return result.stdout


_URL_IN_ERROR = re.compile(r"(?:Failed to fetch:|for url \()\s*`?(https?://[^\s`)]+)")
_NETWORK_MARKERS = ("error sending request", "dns error", "client error (Connect)", "timed out", "Connection refused")


def _uv_error(stack: Stack, stderr: str) -> UserError:
    """uv's multi-line error as one line: which source was unreachable, or why no resolution exists."""
    lines = [line.strip(" ×╰─▶│") for line in stderr.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("warning:", "hint:"))]
    if any(marker in stderr for marker in _NETWORK_MARKERS):
        match = _URL_IN_ERROR.search(stderr)
        url = match.group(1) if match else "a package index"
        cause = lines[-1].removeprefix("cause: ") if lines else "network error"
        return UserError(f"{stack.name}: cannot reach {url} ({cause}); nothing was locked")
    detail = " ".join(line.removeprefix("error: ").removeprefix("cause: ") for line in lines)
    return UserError(f"{stack.name}: uv found no resolution: {detail or 'no output'}")


def _wheels_from_pylock(pylock: dict, platform: str = PLATFORM) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """{name: (version, [(wheel url, sha256), ...])} from uv's pylock.toml."""
    wheels: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for package in pylock.get("packages", []):
        name = canonicalize_name(package["name"])
        files = [(w["url"], w["hashes"]["sha256"]) for w in package.get("wheels", [])]
        archive = package.get("archive")
        if archive:  # a direct-URL requirement
            files.append((archive["url"], archive["hashes"]["sha256"]))
        if not files:
            raise BuildFailure(f"uv resolved {name} without a wheel for {platform}")
        wheels[name] = (package.get("version") or _version_from_url(files[0][0]), files)
    return wheels


def _version_from_url(url: str) -> str:
    return str(parse_wheel_filename(_filename(url))[1])


def _filename(url: str) -> str:
    return unquote(urlsplit(url).path.rsplit("/", 1)[-1])


@dataclass(frozen=True)
class AnnotatedEntry:
    name: str
    version: str | None  # None for a direct-URL requirement
    url: str | None
    parents: tuple[str, ...]  # distributions that require it (requirement files left out)
    index: str | None  # the index it came from (`# from`)


def parse_annotated(text: str) -> dict[str, AnnotatedEntry]:
    """Parse `uv pip compile` requirements output with `# via` and `# from` annotations."""
    entries: dict[str, AnnotatedEntry] = {}
    current: dict | None = None

    def finish() -> None:
        if current:
            entries[current["name"]] = AnnotatedEntry(
                current["name"], current["version"], current["url"], tuple(current["parents"]), current["index"]
            )

    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("--hash"):
            continue
        if not raw[0].isspace() and not line.startswith("#"):
            finish()
            requirement = line.split(";")[0].rstrip(" \\")
            if " @ " in requirement:
                name, url = requirement.split(" @ ", 1)
                current = {"name": canonicalize_name(name), "version": None, "url": url.strip(),
                           "parents": [], "index": None}
            else:
                name, _, version = requirement.partition("==")
                current = {"name": canonicalize_name(name), "version": version.strip(), "url": None,
                           "parents": [], "index": None}
        elif current is not None and line.startswith("#"):
            comment = line.lstrip("#").strip()
            if comment.startswith("from "):
                current["index"] = comment.removeprefix("from ").strip()
            elif comment.startswith("via"):
                current["parents"].extend(_parents(comment.removeprefix("via")))
            else:
                current["parents"].extend(_parents(comment))
    finish()
    return entries


def _parents(text: str) -> list[str]:
    """Names in a `# via` entry; `-r file` and `--override file` are requirement files, not parents."""
    text = text.strip()
    if not text or text.startswith("-"):
        return []
    return [canonicalize_name(part.strip()) for part in text.split(",") if part.strip()]


def assign_groups(parents: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Install group of every distribution: torch and everything it pulls in; then the kernels
    (sgl-kernel, flashinfer-*) and what they pull in beyond torch's closure; then the rest.
    uv's graph names no extras, so an extra another package asks for (sglang's fsspec[http])
    counts as its base package's dependency and may install a group early: harmless."""
    children: dict[str, set[str]] = {name: set() for name in parents}
    for name, its_parents in parents.items():
        for parent in its_parents:
            children.setdefault(parent, set()).add(name)
    groups: dict[str, str] = {}
    for group in GROUP_ORDER[:-1]:
        roots = [name for name in sorted(parents) if PACKAGE_GROUPS.get(name) == group]
        for name in _closure(roots, children):
            groups.setdefault(name, group)
    for name in parents:
        groups.setdefault(name, GROUP_ORDER[-1])
    return groups


def _closure(roots: list[str], children: dict[str, set[str]]) -> list[str]:
    seen: list[str] = []
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.append(name)
        stack.extend(sorted(children.get(name, ())))
    return seen


def target_tags(python: str, newest_glibc_minor: int = _GLIBC_MINOR) -> list[tags.Tag]:
    """Wheel tags the target interpreter accepts, most preferred first (as pip and uv rank them)."""
    major, minor = (int(part) for part in python.split(".")[:2])
    platforms: list[str] = []
    for glibc_minor in range(newest_glibc_minor, 4, -1):
        platforms.append(f"manylinux_2_{glibc_minor}_x86_64")
        if glibc_minor in _LEGACY_MANYLINUX:
            platforms.append(f"{_LEGACY_MANYLINUX[glibc_minor]}_x86_64")
    interpreter = f"cp{major}{minor}"
    return [
        *tags.cpython_tags((major, minor), abis=[interpreter], platforms=platforms),
        *tags.compatible_tags((major, minor), interpreter=interpreter, platforms=platforms),
    ]


def fitting_wheels(files: list[tuple[str, str]], ranking: dict[tags.Tag, int]) -> list[tuple[str, str]]:
    """(filename, sha256) of the wheels the target accepts, best first: the installer takes the first."""
    ranked = []
    for url, sha256 in files:
        filename = _filename(url)
        if not filename.endswith(".whl"):
            continue
        rank = min((ranking[t] for t in parse_wheel_filename(filename)[3] if t in ranking), default=None)
        if rank is not None:
            ranked.append((rank, filename, sha256))
    return [(filename, sha256) for _, filename, sha256 in sorted(ranked)]


def _assemble(stack, indexes, strategy, wheels, entries, platform: str = PLATFORM) -> WheelResolution:
    if {name for name in wheels} != set(entries) or any(
        entry.version is not None and entry.version != wheels[name][0] for name, entry in entries.items()
    ):
        raise BuildFailure(f"{stack.name}: the two uv passes disagree (an index changed meanwhile?); run again")
    groups = assign_groups({name: entry.parents for name, entry in entries.items()})
    glibc_minor = int(platform.rsplit("_", 1)[1])
    ranking = {tag: rank for rank, tag in enumerate(target_tags(stack.python, glibc_minor))}
    distributions = []
    for name in sorted(entries):
        entry = entries[name]
        version, files = wheels[name]
        fitting = fitting_wheels(files, ranking)
        if not fitting:
            raise BuildFailure(f"{stack.name}: no wheel of {name} {version} fits python {stack.python} on {platform}")
        distributions.append(Distribution(
            name=name, version=version, sha256=fitting[0][1], wheel=fitting[0][0],
            hashes=tuple(sorted({sha for _, sha in fitting})), source=_source(entry, indexes),
            group=groups[name], url=entry.url,
        ))
    return WheelResolution(stack.python, platform, indexes, strategy, tuple(distributions))


def _source(entry: AnnotatedEntry, indexes: tuple[str, ...]) -> str:
    if entry.url:
        return entry.url
    by_normal_form = {index.rstrip("/"): index for index in indexes}
    return by_normal_form.get((entry.index or "").rstrip("/"), DEFAULT_INDEX)
