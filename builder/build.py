"""`builder build`: rendered stack -> image on a real engine -> smoke gate -> tags, report, lock.

A build lands under a candidate tag. Only when the smoke checks pass does the
immutable tag point at it and the moving tag move; a failed build or smoke
test leaves every existing tag where it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from builder import hostnet, lock, render, sbom, smoke, tags
from builder.engine import get_engine
from builder.engine.base import BuildRequest, BuildResult, Engine
from builder.errors import BuildFailure, UserError
from builder.files import write_atomic
from builder.progress import Progress
from builder.stack import Stack

REPORTS = "build-reports"


@dataclass(frozen=True)
class BuildOutcome:
    stack: str
    image_id: str
    immutable_tag: str
    moving_tag: str
    report_path: Path


def _git(*args: str) -> str:
    result = subprocess.run(["git", "-C", str(render.REPO_ROOT), *args], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def build_labels(stack: Stack) -> dict[str, str]:
    """Labels that depend on the checkout, not the stack: set at build time, not rendered.

    The revision is the last commit that changed what the image is built from (its rendered folder,
    patches, in-image tools), so a commit elsewhere in the repository leaves the digest alone.
    """
    dockerfile = render.REPO_ROOT / render.stack_dir(stack) / "Dockerfile"
    inputs = sorted({render.stack_dir(stack), *tags.copied_sources(dockerfile.read_text(encoding="utf-8"))})
    revision = _git("log", "-1", "--format=%H", "--", *inputs) or "unknown"
    if _git("status", "--porcelain", "--", *inputs):
        revision += "-dirty"
    labels = {"org.opencontainers.image.revision": revision}
    source = _git("config", "--get", "remote.origin.url")
    if source:
        labels["org.opencontainers.image.source"] = source
    return labels


def build_request(stack: Stack, candidate: str, no_cache: bool, progress: Progress) -> BuildRequest:
    network = hostnet.host_network()
    return BuildRequest(
        context_dir=render.REPO_ROOT,
        dockerfile=render.REPO_ROOT / render.stack_dir(stack) / "Dockerfile",
        tags=(candidate,),
        source_date_epoch=stack.source_date_epoch,
        build_args={"SOURCE_DATE_EPOCH": str(stack.source_date_epoch)},
        add_hosts=network.add_hosts,
        secrets=network.secrets,
        labels=build_labels(stack),
        no_cache=no_cache,
        progress=progress.line,
    )


def patch_layer_sizes(result: BuildResult) -> list[dict]:
    return [
        {"step": layer.created_by, "bytes": layer.size}
        for layer in result.layers
        if "apply_patch.py" in layer.created_by and "--site-packages" in layer.created_by
    ]


def write_report(stack: Stack, result: BuildResult, smoke_report: dict, durations: dict,
                 immutable: str, moving: str) -> Path:
    report = {
        "stack": stack.name,
        "engine": result.engine,
        "image_id": result.image_id,
        "digest": result.image_id,
        "tags": [immutable, moving] if smoke_report.get("passed") else [],
        "source_date_epoch": stack.source_date_epoch,
        "layers": [{"diff_id": l.diff_id, "bytes": l.size, "step": l.created_by} for l in result.layers],
        "patch_layers": patch_layer_sizes(result),
        "smoke": smoke_report,
        "durations_s": durations,
    }
    path = render.REPO_ROOT / REPORTS / f"{stack.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")
    return path


def build_stack(stack: Stack, engine: Engine, progress: Progress, no_cache: bool = False) -> BuildOutcome:
    render.require_locked(stack)
    inputs = tags.inputs_hash(stack)
    candidate = tags.candidate_tag(stack, inputs)
    immutable, moving = tags.immutable_tag(stack, inputs), tags.moving_tag(stack)
    progress.stage(f"{stack.name}: building {immutable}")
    started = time.monotonic()
    result = engine.build(build_request(stack, candidate, no_cache, progress))
    durations = {"build": result.duration_s, "deliver_to_docker": result.deliver_s}
    try:
        progress.stage(f"{stack.name}: smoke checks in {candidate}")
        smoke_started = time.monotonic()
        report = smoke.run_in_image(candidate)
        durations["smoke"] = round(time.monotonic() - smoke_started, 1)
        smoke_result = report.to_dict()
        progress.block(report.table())
        durations["total"] = round(time.monotonic() - started, 1)
        report_path = write_report(stack, result, smoke_result, durations, immutable, moving)
        if not smoke_result["passed"]:
            lock.record_smoke(stack.name, passed=False, report=smoke_result, image_id=result.image_id)
            raise BuildFailure(f"{stack.name}: smoke checks failed; {immutable} not tagged (report: {report_path})")
        engine.tag(candidate, immutable)
        engine.tag(candidate, moving)
    finally:
        engine.remove(candidate)
    lock.record_build(stack, image_id=result.image_id, tags=[immutable, moving],
                      report_path=str(report_path.relative_to(render.REPO_ROOT)))
    lock.record_smoke(stack.name, passed=True, report=smoke_result, image_id=result.image_id)
    sbom_path = sbom.write_image_sbom(stack.name, report_path)
    progress.stage(f"{stack.name}: SBOM {sbom_path.relative_to(render.REPO_ROOT)}")
    progress.stage(f"{stack.name}: {immutable} = {result.image_id} ({durations['total']} s)")
    return BuildOutcome(stack.name, result.image_id, immutable, moving, report_path)


def build_all(stacks: tuple[Stack, ...], engine_name: str, no_cache: bool = False) -> list[BuildOutcome]:
    if not stacks:
        raise UserError("no stack selected")
    engine = get_engine(engine_name)
    engine.check()
    progress = Progress.for_environment()
    return [build_stack(stack, engine, progress, no_cache) for stack in stacks]


def default_engine() -> str:
    return os.environ.get("BUILDER_ENGINE", "buildah")
