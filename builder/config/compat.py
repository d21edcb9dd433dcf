"""Compatibility rules between a stack's pins, one small function each.

Each rule takes a stack row and returns problems as (key path inside the stack,
message). Facts about published wheels live in compat_data.toml, not in code.
"""

from __future__ import annotations

import os
import re
import tomllib
from functools import cache
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from builder.config.stack import Stack

Problem = tuple[tuple, str]

_CUDA_LOCAL_TAG = re.compile(r"^cu(\d{2,3})$")
_ARCH = re.compile(r"^\d{1,2}\.\d$")


def generated_facts_path() -> Path:
    """compat_generated.toml beside this module; BUILDER_COMPAT_FACTS points elsewhere (tests, scratch bumps)."""
    return Path(os.environ.get("BUILDER_COMPAT_FACTS") or Path(__file__).with_name("compat_generated.toml"))


@cache
def compat_data() -> dict:
    """The hand-kept facts, with the generated ones (compat_refresh) added where none is hand-kept."""
    with open(Path(__file__).with_name("compat_data.toml"), "rb") as handle:
        data = tomllib.load(handle)
    data["wheel_glibc"] = {}
    generated = generated_facts_path()
    if generated.is_file():
        with open(generated, "rb") as handle:
            facts = tomllib.load(handle).get("facts", {})
        for key, fact in facts.items():
            name, _, version = key.partition("==")
            data["wheel_tags"].setdefault(name, {}).setdefault(version, fact["wheel_tags"])
            data["declared"].setdefault(key, fact.get("declared", {}))
            if fact.get("cuda"):
                data["default_index_cuda"].setdefault(name, {}).setdefault(version, fact["cuda"])
            if fact.get("glibc"):
                data["wheel_glibc"].setdefault(name, {})[version] = fact["glibc"]
    return data


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def _cuda_of_local_tag(local: str | None) -> str | None:
    """'cu130' -> '13.0', 'cu128' -> '12.8'."""
    match = _CUDA_LOCAL_TAG.match(local or "")
    if not match:
        return None
    digits = match.group(1)
    return f"{digits[:-1]}.{digits[-1]}"


def package_cuda(stack: Stack, name: str) -> str | None:
    """The CUDA a pinned wheel is built for: its +cuXYZ tag, else the default index's build."""
    package = stack.package(name)
    version = package.parsed_version
    tagged = _cuda_of_local_tag(version.local)
    if tagged or package.index or package.url:
        return tagged
    return compat_data()["default_index_cuda"].get(name, {}).get(str(version))


def resolver_glibc_minor(stack: Stack, floor: int) -> int:
    """The manylinux glibc minor to resolve the stack's wheels for: `floor`, or the newest one a
    pinned default-index wheel needs (sglang 0.5.23 ships manylinux_2_34 only). Both bases run newer
    glibc (Debian bookworm 2.36, Ubuntu 24.04 2.39)."""
    needed = [int(glibc.split(".")[1]) for package in stack.packages if not (package.index or package.url)
              if (glibc := compat_data()["wheel_glibc"].get(package.name, {}).get(package.parsed_version.public))]
    return max([floor, *needed])


def torch_matches_cuda(stack: Stack) -> list[Problem]:
    if not stack.package("torch"):
        return [(("packages",), "the stack pins no torch")]
    torch = stack.package("torch")
    built_for = package_cuda(stack, "torch")
    where = ("packages", "torch", "version")
    if built_for is None:
        return [(where, f"torch {torch.version} from {torch.source} has no +cuXYZ tag, so its CUDA is unknown")]
    if _major_minor(built_for) != _major_minor(stack.cuda):
        return [(where, f"torch {torch.version} is built for CUDA {built_for} but the stack's CUDA is {stack.cuda}")]
    return []


def kernels_match_cuda(stack: Stack) -> list[Problem]:
    """sgl-kernel (sglang-kernel from sglang 0.5.10 on) and flashinfer-jit-cache link one CUDA major's
    libraries (libcudart.so.12 or .13)."""
    problems = []
    for name in ("sgl-kernel", "sglang-kernel", "flashinfer-jit-cache"):
        package = stack.package(name)
        if not package:
            continue
        built_for = package_cuda(stack, name)
        where = ("packages", name, "version")
        if built_for is None:
            problems.append((where, f"{name} {package.version} from {package.source} has no +cuXYZ tag, so its CUDA is unknown"))
        elif _major_minor(built_for)[0] != _major_minor(stack.cuda)[0]:
            problems.append((where, f"{name} {package.version} is built for CUDA {built_for} but the stack's CUDA is {stack.cuda}"))
    return problems


def flashinfer_versions_match(stack: Stack) -> list[Problem]:
    """`import flashinfer` raises unless cubin equals it exactly and jit-cache starts with its version."""
    flashinfer = stack.package("flashinfer-python")
    if not flashinfer:
        return []
    problems = []
    cubin = stack.package("flashinfer-cubin")
    if cubin and Version(cubin.version) != Version(flashinfer.version):
        problems.append((("packages", "flashinfer-cubin", "version"),
                         f"flashinfer-cubin {cubin.version} must equal flashinfer-python {flashinfer.version}"))
    jit_cache = stack.package("flashinfer-jit-cache")
    if jit_cache and Version(jit_cache.version).public != Version(flashinfer.version).public:
        problems.append((("packages", "flashinfer-jit-cache", "version"),
                         f"flashinfer-jit-cache {jit_cache.version} must match flashinfer-python {flashinfer.version}"))
    return problems


def _wheel_tags(stack: Stack, name: str) -> list[str] | None:
    package = stack.package(name)
    if package.url:
        _, _, _, tags = parse_wheel_filename(package.url.rsplit("/", 1)[-1])
        return sorted({f"{tag.interpreter}-{tag.abi}" for tag in tags})
    return compat_data()["wheel_tags"].get(name, {}).get(package.parsed_version.public)


def _tag_supports(tag: str, python: str) -> bool:
    interpreter, abi = tag.split("-")
    if interpreter.startswith("py"):
        return interpreter[2:3] == python.split(".")[0]
    wanted = _major_minor(python)
    built = (int(interpreter[2]), int(interpreter[3:]))
    if abi == "abi3":
        return built[0] == wanted[0] and built <= wanted
    return built == wanted and not abi.endswith("t")


def python_supported(stack: Stack) -> list[Problem]:
    problems = []
    for package in stack.packages:
        tags = _wheel_tags(stack, package.name)
        where = ("packages", package.name, "version")
        if tags is None:
            problems.append((where, f"no wheel-tag facts for {package.name} {package.version}: run `builder compat refresh "
                                    f"{package.name}=={package.parsed_version.public}`"))
        elif not any(_tag_supports(tag, stack.python) for tag in tags):
            problems.append((where, f"{package.name} {package.version} has no wheel for Python {stack.python} (tags: {', '.join(tags)})"))
    return problems


def base_matches_cuda(stack: Stack) -> list[Problem]:
    if stack.base.local or _major_minor(stack.base.cuda) == _major_minor(stack.cuda):
        return []
    return [(("base",), f"base {stack.base.name} has CUDA {stack.base.cuda} but the stack's CUDA is {stack.cuda}")]


def target_arch_valid(stack: Stack) -> list[Problem]:
    return [(("target_arch",), f"target_arch '{arch}' must look like '12.0'")
            for arch in stack.target_arch if not _ARCH.fullmatch(arch)]


def patch_series_match(stack: Stack, patches_root: Path) -> list[Problem]:
    problems = []
    for name in stack.patched:
        package = stack.package(name)
        if not package:
            problems.append((("patched",), f"patched package '{name}' is not pinned in the stack"))
            continue
        series_dir = patches_root / name / package.version
        if (series_dir / "series").is_file():
            continue
        written_for = sorted(p.name for p in (patches_root / name).glob("*") if (p / "series").is_file())
        if written_for:
            problems.append((("patched",), f"the {name} patch series is written for {', '.join(written_for)}, "
                                           f"but the stack pins {package.version}"))
        else:
            problems.append((("patched",), f"no patch series for {name} {package.version} (expected patches/{name}/{package.version}/series)"))
    return problems


def declared_requirements_respected(stack: Stack) -> list[Problem]:
    """A pin contradicting a pinned package's own requirement needs an override with a reason."""
    declared = compat_data()["declared"]
    conflicts = set()
    problems = []
    for declaring in stack.packages:
        requirements = declared.get(f"{declaring.name}=={declaring.parsed_version.public}", {})
        for name, specifier in requirements.items():
            pinned = stack.package(name)
            if pinned is None or SpecifierSet(specifier).contains(pinned.parsed_version, prereleases=True):
                continue
            conflicts.add((canonicalize_name(name), declaring.name))
            if not any(o.package == pinned.name and o.declared_by == declaring.name for o in stack.overrides):
                problems.append((("packages", pinned.name, "version"),
                                 f"{pinned.name} {pinned.version} contradicts {declaring.name} {declaring.version}'s "
                                 f"requirement {name}{specifier}; declare an override with a reason"))
    for index, override in enumerate(stack.overrides):
        if (override.package, override.declared_by) not in conflicts:
            problems.append((("overrides", index), f"override of {override.package} by {override.declared_by} "
                                                   f"is not needed: no declared requirement is contradicted"))
    return problems


def declared_requirement(declaring: str, version: str, name: str) -> str:
    """The specifier `declaring==version` states for `name` ('' when none)."""
    return compat_data()["declared"].get(f"{declaring}=={version}", {}).get(name, "")


def minimum_driver(cuda: str) -> dict | None:
    """{"cuda", "minimum", "source"}: the oldest Linux driver the CUDA toolkit release runs on."""
    entry = compat_data()["cuda_driver"].get(cuda)
    return {"cuda": cuda, "minimum": entry["linux"], "source": entry["source"]} if entry else None


def minimum_driver_known(stack: Stack) -> list[Problem]:
    if minimum_driver(stack.cuda) is None:
        return [(("cuda",), f"no minimum NVIDIA driver is recorded for CUDA {stack.cuda}; add it to "
                            "builder/config/compat_data.toml [cuda_driver] from NVIDIA's CUDA Toolkit release notes")]
    return []


def switches_have_reasons(stack: Stack) -> list[Problem]:
    """A serve profile's switch (a flag set to true) says why, and every reason names a setting of its mode."""
    problems = []
    for mode in stack.serve.modes:
        where = ("serve", "modes", mode.name)
        for name, value in mode.args.items():
            if value is True and not mode.reasons.get(name, "").strip():
                problems.append((where + ("args",), f"serve mode {mode.name} switches on {name} without a reason "
                                                     f"(add reasons.{name})"))
        for name in mode.reasons:
            if name not in mode.args:
                problems.append((where + ("reasons", name), f"serve mode {mode.name} gives a reason for {name}, "
                                                            "which it does not set"))
    return problems


def compiler_matches_runtime(stack: Stack) -> list[Problem]:
    """A pinned CUDA compiler wheel is the CUDA runtime's major.minor (compat_data.toml [nvcc_runtime_minor])."""
    rule = compat_data()["nvcc_runtime_minor"]
    runtime = package_cuda(stack, "torch") if stack.package("torch") else None
    problems = []
    for name in rule["packages"]:
        package = stack.package(name)
        if not package or runtime is None:
            continue
        if _major_minor(package.parsed_version.public) != _major_minor(runtime):
            problems.append((("packages", name, "version"),
                             f"{name} {package.version} is not the CUDA runtime's release {runtime} (torch's): "
                             f"PTX from a newer compiler needs a newer driver ({rule['source']})"))
    return problems


def serve_features_present(stack: Stack) -> list[Problem]:
    """A serve mode turning on a feature through the environment needs an sglang that has it
    (compat_data.toml [serve_features])."""
    sglang = stack.package("sglang")
    version = sglang.parsed_version.public if sglang else None
    problems = []
    for feature, fact in compat_data().get("serve_features", {}).items():
        for mode in stack.serve.modes:
            if fact["env"] in mode.env and version not in fact["sglang"]:
                problems.append((("serve", "modes", mode.name, "env", fact["env"]),
                                 f"serve mode {mode.name} sets {fact['env']}, but sglang {version} has no "
                                 f"{feature} ({fact['module']}); it is in sglang {', '.join(fact['sglang'])}"))
    return problems


def check_stack(stack: Stack, patches_root: Path) -> list[Problem]:
    return [
        *switches_have_reasons(stack),
        *serve_features_present(stack),
        *target_arch_valid(stack),
        *minimum_driver_known(stack),
        *base_matches_cuda(stack),
        *torch_matches_cuda(stack),
        *kernels_match_cuda(stack),
        *compiler_matches_runtime(stack),
        *flashinfer_versions_match(stack),
        *python_supported(stack),
        *patch_series_match(stack, patches_root),
        *declared_requirements_respected(stack),
    ]
