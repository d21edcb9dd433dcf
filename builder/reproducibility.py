"""`builder verify`: two builds from empty storage, compared layer by layer.

The base images are exported once from the engine's storage and loaded into
each fresh storage, so nothing cached by earlier builds can hide a difference.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from builder import build, hostnet, render, tags, verify
from builder.engine import get_engine
from builder.engine.base import BuildRequest
from builder.errors import UserError
from builder.matrix import LOCAL_BASE_REPOSITORY, Matrix
from builder.progress import Progress
from builder.stack import Stack

WORKDIR = "build/verify"


def _scratch(name: str) -> Path:
    workdir = render.REPO_ROOT / WORKDIR / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    return workdir


def _export_bases(images: list[str], workdir: Path) -> tuple[Path, ...]:
    engine = get_engine("buildah")
    engine.check()
    archives = []
    for index, image in enumerate(images):
        if not engine.exists(image):
            raise UserError(f"base image {image} is not in buildah's storage (for the local base: `builder base`)")
        archive = workdir / f"base-{index}.docker.tar"
        engine.save(image, archive)
        archives.append(archive)
    return tuple(archives)


def _twice(request: BuildRequest, bases: list[str], name: str) -> verify.Comparison:
    workdir = _scratch(name)
    try:
        two = verify.build_twice(request, _export_bases(bases, workdir), workdir, save_when_identical=False)
        if two.identical:
            return verify.Comparison(first_id=two.image_ids[0], second_id=two.image_ids[1])
        return verify.compare(*two.archives)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def verify_stack(stack: Stack) -> verify.Comparison:
    render.require_locked(stack)
    progress = Progress.for_environment()
    progress.stage(f"{stack.name}: two builds from empty storage")
    request = build.build_request(stack, tags.candidate_tag(stack, tags.inputs_hash(stack)), True, progress)
    return _twice(request, [stack.base.image], stack.name)


def verify_dockerfile(dockerfile: str, context: str, bases: list[str], matrix: Matrix) -> verify.Comparison:
    path, context_dir = Path(dockerfile).resolve(), Path(context).resolve()
    if not path.is_file():
        raise UserError(f"no Dockerfile at {dockerfile}")
    network = hostnet.host_network()
    request = BuildRequest(
        context_dir=context_dir, dockerfile=path, tags=("localhost/builder-verify:scratch",),
        source_date_epoch=matrix.source_date_epoch,
        build_args={"SOURCE_DATE_EPOCH": str(matrix.source_date_epoch)},
        add_hosts=network.add_hosts, secrets=network.secrets, no_cache=True,
        progress=Progress.for_environment().line,
    )
    return _twice(request, bases or [f"{LOCAL_BASE_REPOSITORY}:{matrix.local_base['name']}"], "dockerfile")


def report(comparison: verify.Comparison) -> int:
    for line in comparison.describe():
        print(line)
    if comparison.identical:
        return 0
    print("builder: error: the two builds differ: not reproducible", file=sys.stderr)
    return 1
