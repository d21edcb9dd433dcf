"""Made-up lock values for tests that need a resolution, a base digest or system packages without an
index, a registry or an archive; and bench reports shaped as the entrypoint writes them."""

from __future__ import annotations

import hashlib

from builder.lock.build_report import BuildReport, InputFile, ReportLayer
from builder.lock.model import Distribution
from builder.lock.resolve import PLATFORM, WheelResolution
from builder.lock.smoke_report import SmokeReport
from builder.runtime.smoke.report import Result
from checkouts import REPO


IMAGE = "sha256:" + "1" * 64
OTHER_IMAGE = "sha256:" + "2" * 64


def smoke_report(passed: bool = True, image: str = IMAGE, stack: str = "sglang-0.5.9-cu128") -> SmokeReport:
    """A one-check smoke report, as the gate gives it."""
    return SmokeReport(image, stack, (Result("imports.torch", "pass" if passed else "fail", "planted"),))


def build_report(stack: str, image: str = IMAGE, files=(), layer_sizes=(), smoke: SmokeReport | None = None
                 ) -> BuildReport:
    """A build report as `builder build` writes it, of made-up layers and the given input files."""
    layers = tuple(ReportLayer("sha256:" + f"{i:x}" * 64, size, f"step {i}") for i, size in enumerate(layer_sizes))
    return BuildReport(stack, "buildah", None, image, ("sglang:x",), 1767225600, "f" * 64, "base@unpinned",
                       tuple(InputFile(f.path, f.mode, f.sha256) for f in files), layers, {},
                       smoke or smoke_report(image=image, stack=stack))


def dist(name, version, group, source="default index", url=None, hashes=None):
    """A locked distribution with made-up hashes: what `builder lock` records, without an index."""
    sha = (name.encode().hex() * 64)[:64]
    return Distribution(name=name, version=version, sha256=sha, wheel=f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                        hashes=tuple(hashes or (sha,)), source=source, group=group, url=url)


def resolution_of(stack, *extra):
    """A resolution of exactly the stack's pins (plus `extra`), as a resolver would return it."""
    indexes = tuple(dict.fromkeys(p.index for p in stack.packages if p.index))
    distributions = [dist(p.name, p.version, group, source=p.url or p.index or "default index", url=p.url)
                     for group in ("torch", "kernels", "sglang") for p in stack.packages_in_group(group)]
    return WheelResolution(stack.python, PLATFORM, indexes, "unsafe-best-match" if indexes else "first-index",
                      tuple(sorted([*distributions, *extra], key=lambda d: d.name)))


def base_digest_of(image: str) -> str:
    """A made-up manifest digest for a registry base, as `builder lock` records one without a registry."""
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def system_packages_of(spec):
    """Locked system packages of exactly the requested names (no closure), as `builder lock` records them
    without an archive; each file's hash is made up from its name."""
    from builder.lock.system_packages import DebArchive, DebPackage, SystemPackages
    archive = DebArchive("debian", spec.suite, ("main",), "Thu, 01 Jan 2026 00:00:00 UTC", "")
    packages = tuple(DebPackage(name, "1.0", spec.architecture, f"pool/main/{name}_1.0_{spec.architecture}.deb",
                                100, hashlib.sha256(name.encode()).hexdigest(), 0) for name in sorted(spec.packages))
    return SystemPackages(spec.distribution, spec.architecture, spec.scope, spec.packages, (archive,), packages)


def locked_base_packages():
    """The local base's .debs as the committed matrix.lock records them (every local row shares them)."""
    from builder.lock import store
    return store.entry("sglang-0.5.9-cu128-local", REPO / "matrix.lock").resolution.system_packages


def locked_base_sources():
    """Where `builder base` fetches the base's .debs from first, and what its apt sources name: apt's
    mirror for the local rows (the snapshot archive only as the fallback)."""
    from builder.cli.commands.base import local_base_sources
    from builder.config.matrix import load_matrix
    return local_base_sources(load_matrix(REPO / "matrix.toml"))


def locked_base_spec(**fields):
    """A BaseSpec asking for the packages the lock's base was resolved from, so mmdebstrap installs exactly
    the locked closure (the matrix's [local_base] list, not the builder's built-in default)."""
    from builder.base.local_base import BaseSpec
    return BaseSpec(packages=locked_base_packages().requested, **fields)


def bench_report(mode="eagle3", tok_s=55.0, verdict="pass", stack="sglang-0.5.9-cu128"):
    """Shaped as builder/runtime/serve/bench.py writes it (schema 1)."""
    return {"schema": 1, "stack": stack, "mode": mode, "model": "/models/test", "gpus": ["NVIDIA RTX PRO 6000 Blackwell"] * 8,
            "tok_s": tok_s, "ttft_ms": 210.0, "reference_tok_s": 54.1, "verdict": verdict,
            "workload": {"concurrency": 1, "input_len": 1024, "output_len": 512}}
