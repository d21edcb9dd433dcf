"""pip's default index through the PEP 691 simple JSON API: a project's versions and files (name,
size, sha256), and a wheel's core metadata read from the wheel itself by range requests (the index
serves no separate .metadata files).

The index is pip's own default (or PIP_INDEX_URL), never a host name written here.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from email.parser import Parser
from functools import cached_property
from urllib.parse import urljoin

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.bump import remote_zip
from builder.errors import UserError

_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 60


def default_index_url() -> str:
    """PIP_INDEX_URL when set, else pip's built-in default simple index."""
    configured = os.environ.get("PIP_INDEX_URL")
    if configured:
        return configured.rstrip("/") + "/"
    from pip._internal.models.index import PyPI  # pip's own constant: the host is never typed here

    return PyPI.simple_url.rstrip("/") + "/"


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    size: int
    sha256: str
    yanked: bool

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")

    @cached_property
    def wheel_tags(self):
        return parse_wheel_filename(self.filename)[3]

    @property
    def linux_x86_64(self) -> bool:
        return any(t.platform == "any" or (t.platform.startswith("manylinux") and t.platform.endswith("_x86_64"))
                   or t.platform == "linux_x86_64" for t in self.wheel_tags)


@dataclass(frozen=True)
class Project:
    name: str
    files: tuple[IndexFile, ...]
    index: str

    def versions(self) -> list[Version]:
        found = set()
        for file in self.files:
            if not file.is_wheel:
                continue
            try:
                found.add(parse_wheel_filename(file.filename)[1])
            except (InvalidWheelFilename, InvalidVersion):
                continue
        return sorted(found)

    def wheels(self, version: str) -> list[IndexFile]:
        """The release's linux x86_64 (or pure) wheels, not yanked."""
        wanted = Version(version)
        out = []
        for file in self.files:
            if not file.is_wheel or file.yanked:
                continue
            try:
                name, found, _, _ = parse_wheel_filename(file.filename)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if found == wanted and file.linux_x86_64:
                out.append(file)
        return sorted(out, key=lambda f: f.filename)


_ANCHOR = re.compile(r"<a\s[^>]*?href=\"([^\"]+)\"([^>]*)>([^<]+)</a>", re.IGNORECASE)


def _html_files(text: str, page: str) -> tuple[IndexFile, ...]:
    """The files a PEP 503 page links: name, URL, sha256 from the fragment; sizes unknown (0)."""
    files = []
    for href, attributes, filename in _ANCHOR.findall(text):
        url, _, fragment = urljoin(page, html.unescape(href)).partition("#")
        sha256 = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else ""
        files.append(IndexFile(html.unescape(filename).strip(), url, 0, sha256, "data-yanked" in attributes))
    return tuple(files)


class Index:
    """One session over one simple index; projects are fetched once."""

    def __init__(self, url: str | None = None, session: requests.Session | None = None):
        self.url = (url or default_index_url()).rstrip("/") + "/"
        self.session = session or requests.Session()
        self._projects: dict[str, Project | None] = {}
        self._metadata: dict[str, str] = {}

    @property
    def label(self) -> str:
        return "pip's default index" if self.url == default_index_url() else self.url

    def project(self, name: str) -> Project | None:
        """The project's files, None when the index has no such project (404)."""
        name = canonicalize_name(name)
        if name not in self._projects:
            try:
                response = self.session.get(f"{self.url}{name}/", headers={"Accept": f"{_JSON}, text/html;q=0.1"},
                                            timeout=TIMEOUT_S)
            except requests.RequestException as error:
                raise UserError(f"cannot reach {self.label} for {name} ({type(error).__name__})") from None
            if response.status_code == 404:
                self._projects[name] = None
            elif response.status_code != 200:
                raise UserError(f"{self.label} answered HTTP {response.status_code} for {name}")
            elif _JSON in response.headers.get("Content-Type", ""):
                files = tuple(IndexFile(f["filename"], f["url"], int(f.get("size") or 0),
                                        f.get("hashes", {}).get("sha256", ""), bool(f.get("yanked")))
                              for f in response.json().get("files", []))
                self._projects[name] = Project(name, files, self.url)
            else:  # PEP 503 HTML, as PyTorch's and FlashInfer's indexes serve it
                self._projects[name] = Project(name, _html_files(response.text, response.url), self.url)
        return self._projects[name]

    def require(self, name: str, version: str) -> Project:
        """The project, refusing an unknown package or a version with no linux x86_64 wheel."""
        project = self.project(name)
        if project is None:
            raise UserError(f"unknown package {name}: {self.label} has no such project")
        try:
            Version(version)
        except InvalidVersion:
            raise UserError(f"{name}: {version!r} is not a valid version") from None
        if not project.wheels(version):
            latest = project.versions()[-1:] or ["none"]
            raise UserError(f"{name} {version} does not exist on {self.label} as a linux x86_64 wheel "
                            f"(newest: {latest[0]})")
        return project

    def top_level(self, name: str, version: str) -> set[str]:
        """The import packages a release's wheel installs (top-level folders holding an __init__.py),
        from the wheel's central directory."""
        project = self.project(name)
        wheels = project.wheels(version) if project else []
        if not wheels:
            return set()
        with remote_zip.open_wheel(wheels[0].url, wheels[0].size, self.session) as wheel:
            return {entry.split("/", 1)[0] for entry in wheel.namelist() if entry.count("/") == 1
                    and entry.endswith("/__init__.py")}

    def metadata(self, file: IndexFile) -> str:
        if file.url not in self._metadata:
            self._metadata[file.url] = remote_zip.metadata(file.url, file.size, self.session)
        return self._metadata[file.url]


def requirements(metadata_text: str) -> list[Requirement]:
    """Requires-Dist of a METADATA text (unparseable lines skipped: they cannot constrain a pin)."""
    message = Parser().parsestr(metadata_text, headersonly=True)
    out = []
    for line in message.get_all("Requires-Dist") or []:
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue
    return out


def applies(requirement: Requirement, pythons: tuple[str, ...]) -> bool:
    """Does the requirement (no extra asked for) apply on linux x86_64 for any of the pythons?"""
    if requirement.marker is None:
        return True
    for python in pythons:
        environment = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                       "python_version": python, "python_full_version": f"{python}.0",
                       "os_name": "posix", "implementation_name": "cpython", "extra": ""}
        if requirement.marker.evaluate(environment):
            return True
    return False
