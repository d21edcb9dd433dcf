"""`builder compat refresh`: compatibility facts generated from the packages themselves, never typed.

For one release on pip's default index: the interpreter-ABI tags and the oldest glibc of its linux
x86_64 wheels (from the wheel file names), the requirements it declares (from the wheel's METADATA,
read by range requests), and the CUDA its default-index build targets: torch's from the CUDA
runtime it requires (`cuda-toolkit==13.0.3` -> 13.0, `nvidia-cuda-runtime-cu12==12.8.90` -> 12.8), a
kernel wheel's from the exact torch it requires (an extension links the CUDA major of its torch).
Each fact records its source (wheel file and sha256). They go to compat_generated.toml, which
compat.py reads beside the hand-kept compat_data.toml; a hand-kept fact wins where both exist.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.bump.index import Index, applies, requirements
from builder.config import toml_write
from builder.config.compat import generated_facts_path
from builder.errors import UserError

# Pythons the bases provide (local base 3.11, CUDA bases 3.12): a requirement applying to either counts.
PYTHONS = ("3.11", "3.12")
# Distributions whose wheels link CUDA through the torch they pin exactly.
TORCH_EXTENSIONS = ("sgl-kernel", "sglang-kernel")
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_x86_64$")
_LEGACY = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}
_DESCRIBED_TORCH = re.compile(r"^Requires torch ?== ?([0-9][0-9a-z.+]*)\s*$", re.MULTILINE)
_CUDA_TOOLKIT = re.compile(r"^(\d+)\.(\d+)")
_CUDA_RUNTIME_NAMES = ("cuda-toolkit", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")


@dataclass(frozen=True)
class Facts:
    name: str
    version: str
    source: str  # the wheel file (and sha256) the facts were read from
    wheel_tags: tuple[str, ...]
    glibc: str  # oldest glibc any of its linux wheels runs on, "" for pure wheels
    declared: dict = field(default_factory=dict)  # name -> specifier
    extras: dict = field(default_factory=dict)  # name -> extras asked for
    cuda: str = ""  # CUDA of the default-index build, "" when it links none
    cuda_source: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}=={self.version}"

    def to_dict(self) -> dict:
        data = {"source": self.source, "wheel_tags": list(self.wheel_tags)}
        if self.glibc:
            data["glibc"] = self.glibc
        if self.cuda:
            data["cuda"] = self.cuda
            data["cuda_source"] = self.cuda_source
        data["declared"] = dict(sorted(self.declared.items()))
        if self.extras:
            data["extras"] = {k: list(v) for k, v in sorted(self.extras.items())}
        return data

    @classmethod
    def from_dict(cls, key: str, data: dict) -> "Facts":
        name, _, version = key.partition("==")
        return cls(name, version, data["source"], tuple(data["wheel_tags"]), data.get("glibc", ""),
                   dict(data.get("declared", {})), {k: tuple(v) for k, v in data.get("extras", {}).items()},
                   data.get("cuda", ""), data.get("cuda_source", ""))


def _glibc(tags) -> tuple[int, int] | None:
    found = []
    for tag in tags:
        if tag.platform in _LEGACY:
            found.append(_LEGACY[tag.platform])
        elif match := _MANYLINUX.match(tag.platform):
            found.append((int(match.group(1)), int(match.group(2))))
    return min(found) if found else None


def derive(name: str, version: str, index: Index, known: dict[str, "Facts"] | None = None) -> Facts:
    """The facts of name==version from the index's file list and one wheel's METADATA."""
    name = canonicalize_name(name)
    project = index.require(name, version)
    wheels = project.wheels(version)
    tags = sorted({f"{t.interpreter}-{t.abi}" for w in wheels for t in w.wheel_tags})
    glibcs = [g for w in wheels if (g := _glibc(w.wheel_tags))]
    glibc = "%d.%d" % min(glibcs) if glibcs else ""
    # Any one wheel's METADATA: a release declares the same requirements in each (markers differ, not pins).
    chosen = wheels[0]
    metadata_text = index.metadata(chosen)
    requirements_list = [r for r in requirements(metadata_text) if applies(r, PYTHONS)]
    declared, extras = {}, {}
    for requirement in requirements_list:
        other = canonicalize_name(requirement.name)
        if requirement.specifier:
            declared[other] = str(requirement.specifier)
        if requirement.extras:
            extras[other] = tuple(sorted(requirement.extras))
    cuda, cuda_source = _cuda(name, requirements_list, metadata_text, index, known if known is not None else {})
    return Facts(name, str(version), f"{index.label}: {chosen.filename} (sha256 {chosen.sha256})",
                 tuple(tags), glibc, declared, extras, cuda, cuda_source)


def _described_torch(metadata_text: str) -> str | None:
    """The torch a kernel wheel's description says it requires ("Requires torch == 2.9.1"): sglang-kernel
    0.4.1 states it there, not in Requires-Dist."""
    match = _DESCRIBED_TORCH.search(metadata_text)
    return match.group(1) if match else None


def _cuda(name: str, requirements_list, metadata_text: str, index: Index,
          known: dict[str, Facts]) -> tuple[str, str]:
    by_name = {canonicalize_name(r.name): r for r in requirements_list}
    for runtime in _CUDA_RUNTIME_NAMES:
        requirement = by_name.get(runtime)
        pinned = _exact(requirement)
        if pinned and (match := _CUDA_TOOLKIT.match(pinned)):
            return f"{match.group(1)}.{match.group(2)}", f"requires {requirement}"
    torch = (_exact(by_name.get("torch")) or _described_torch(metadata_text)) if name in TORCH_EXTENSIONS else None
    if torch:
        facts = known.get(f"torch=={torch}") or derive("torch", torch, index)
        known[facts.key] = facts
        if facts.cuda:
            major = facts.cuda.split(".")[0]
            return major, f"requires torch=={torch}, whose default-index build is CUDA {facts.cuda} ({facts.cuda_source})"
    return "", ""


def _exact(requirement) -> str | None:
    if requirement is None:
        return None
    specs = list(requirement.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version
    return None


# --- the generated file ---------------------------------------------------------

HEADER = ("# Generated by `builder compat refresh` (and `builder bump`) from the packages' own wheels on pip's\n"
          "# default index: never edit by hand. Each entry names the wheel it was read from.\n")


def load(path: Path | None = None) -> dict[str, Facts]:
    path = path or generated_facts_path()
    if not path.is_file():
        return {}
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    return {key: Facts.from_dict(key, value) for key, value in data.get("facts", {}).items()}


def dumps(facts: dict[str, Facts]) -> str:
    chunks = [HEADER]
    for key in sorted(facts):
        chunks.append("\n" + toml_write.table(f"[facts.{toml_write.key(key)}]", facts[key].to_dict()))
    return "".join(chunks)


def save(facts: dict[str, Facts], path: Path | None = None) -> None:
    path = path or generated_facts_path()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(dumps(facts), encoding="utf-8")
    os.replace(temporary, path)


def refresh(pins: list[tuple[str, str]], index: Index | None = None, path: Path | None = None) -> list[Facts]:
    """Derive and record the facts of each name==version (and of the torch a kernel wheel pins)."""
    index = index or Index()
    known = load(path)
    derived = []
    for name, version in pins:
        facts = derive(name, version, index, known)
        known[facts.key] = facts
        derived.append(facts)
    save(known, path)
    return derived


def parse_pin(text: str) -> tuple[str, str]:
    name, sep, version = text.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise UserError(f"{text!r}: give PACKAGE==VERSION")
    return canonicalize_name(name.strip()), version.strip()
