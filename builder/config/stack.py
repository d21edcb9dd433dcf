"""A stack row: the frozen value every step downstream of matrix loading reads.

`builder.config.matrix` builds these from matrix.toml (expanding axes); nothing else
constructs or changes them, and nothing downstream re-reads matrix.toml.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from packaging.utils import canonicalize_name
from packaging.version import Version

# Install order and layer grouping: torch first (largest, changes least), kernels, then sglang.
PACKAGE_GROUPS = {
    "torch": "torch",
    "sgl-kernel": "kernels",
    "sglang-kernel": "kernels",  # sgl-kernel's name from sglang 0.5.10 on
    "flashinfer-python": "kernels",
    "flashinfer-cubin": "kernels",
    "flashinfer-jit-cache": "kernels",
    "sglang": "sglang",
}
GROUP_ORDER = ("torch", "kernels", "sglang")


@dataclass(frozen=True)
class Package:
    """One pinned distribution and where its wheel comes from."""

    name: str  # canonical distribution name (PEP 503), e.g. "sgl-kernel"
    version: str  # exact version, local tag included: "2.9.1+cu130"
    index: str | None = None  # extra index URL; None means pip's default index
    url: str | None = None  # direct wheel URL, for wheels published outside any index

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)

    @property
    def source(self) -> str:
        return self.url or self.index or "default index"

    @property
    def requirement(self) -> str:
        if self.url:
            return f"{self.name} @ {self.url}"
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Override:
    """A pin that contradicts a package's declared requirement, accepted on purpose."""

    package: str
    declared_by: str
    declared: str  # the requirement as the declaring package states it, e.g. "==0.6.3"
    reason: str


@dataclass(frozen=True)
class AptSpec:
    """Where a base's system packages come from, for `builder lock` (builder/lock/debian_archive.py)."""

    distribution: str  # keys the keyring and snapshot archive in builder/config/apt_archives.toml
    suite: str
    packages: tuple[str, ...]
    scope: str  # "root": the local base's whole root file system; "added": what a row adds to a registry base
    architecture: str = "amd64"
    sources: tuple[str, ...] = ()  # 'deb URI SUITE COMPONENT...' lines; empty: mmdebstrap's default
    keyring: str | None = None  # None: the distribution's
    snapshot: str | None = None  # None: the distribution's snapshot archive; "": none


@dataclass(frozen=True)
class Base:
    """The image a stack starts FROM: a registry image or the local mmdebstrap base."""

    name: str
    image: str  # "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04", or the local base's tag
    python: str  # interpreter major.minor the base provides
    venv_python: str  # interpreter that creates /opt/venv
    system_packages: tuple[str, ...]  # packages the build adds to a registry base, from the lock's .debs
    cuda: str | None  # CUDA toolkit in the base; None for the local base
    local: bool
    apt: AptSpec | None = None  # what `builder lock` resolves: the local base's root, a registry base's additions

    def reference(self, digest: str) -> str:
        """What FROM names and CI pulls: a registry base as name@digest once `builder lock` resolved the
        digest (buildah's pull takes no tag beside a digest); the local base by its tag (it is in no
        registry: the build checks the image id behind the tag instead)."""
        if not digest or self.local:
            return self.image
        folder, _, last = self.image.rpartition("/")
        name = last.partition(":")[0]
        return f"{folder}/{name}@{digest}" if folder else f"{name}@{digest}"


@dataclass(frozen=True)
class ServeMode:
    name: str
    args: dict  # ServerArgs names -> values, in matrix order
    env: dict
    requires_draft_model: bool
    reasons: dict = field(default_factory=dict)  # ServerArgs name -> why the profile sets it


@dataclass(frozen=True)
class Serve:
    cache_dir: str
    env: dict
    modes: tuple[ServeMode, ...]


@dataclass(frozen=True)
class Bench:
    input_len: int
    output_len: int
    num_prompts: int
    regression_tolerance: float


PLATFORM = "linux/amd64"


@dataclass(frozen=True)
class Stack:
    name: str  # row name: stack name plus axis values, usable as a tag
    family: str  # the [[stack]] name the row expanded from
    description: str
    axes: tuple[tuple[str, str], ...]  # (axis, value) pairs that produced this row
    cuda: str
    python: str
    base: Base
    target_arch: tuple[str, ...]  # compute capabilities, e.g. ("12.0",)
    packages: tuple[Package, ...]
    overrides: tuple[Override, ...]
    patched: tuple[str, ...]  # distributions with a patch series
    # Kernel families whose target-architecture code is compiled at first start, not shipped: name -> why.
    jit_device_code: dict
    serve: Serve
    bench: Bench
    source_date_epoch: int
    repository: str
    source_line: int = field(default=0, compare=False)  # [[stack]] line in matrix.toml
    source_url: str = ""  # the project's public repository, from the matrix (never from the clone)
    # The row this one replaced (its stack before an upgrade): `bench` falls back to its figures.
    replaces: str | None = None

    @property
    def platform(self) -> str:
        """The os/arch every row is built for (the SM120 machines are x86-64), passed to the engine."""
        return PLATFORM

    def package(self, name: str) -> Package | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    @property
    def patch_series(self) -> list[tuple[str, str]]:
        """(distribution, version) of each patched package, in matrix order."""
        return [(name, self.package(name).version) for name in self.patched]

    @property
    def cuda_tag(self) -> str:
        major, minor = self.cuda.split(".")[:2]
        return f"cu{major}{minor}"

    def packages_in_group(self, group: str) -> list[Package]:
        return [p for p in self.packages if PACKAGE_GROUPS.get(p.name, "sglang") == group]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("source_line")
        return data
