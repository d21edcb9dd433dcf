"""`builder verify`: two builds from empty storage, compared layer by layer; or, with --against-lock,
one build of the committed inputs compared with the image the committed lock records.

The base images are exported once from the engine's storage and loaded into
each fresh storage, so nothing cached by earlier builds can hide a difference.
"""

from __future__ import annotations

import concurrent.futures
import io
from dataclasses import replace
import subprocess
import sys
import tarfile
from pathlib import Path

from builder.build_stack import build, context
from builder.cache import deb_cache, wheel_cache
from builder.config import tags
from builder.config.matrix import Matrix, load_matrix
from builder.config.stack import Stack
from builder.engine.identity import describe
from builder.engine.progress import Progress
from builder.engine.protocol import BuildRequest, ImageInfo, Layer, StorageEngine
from builder.errors import BuildFailure, UserError
from builder.files import remove_scratch
from builder.lock import build_report, store
from builder.lock.resolution import base_pin, check_current
from builder.oci import layer_diff
from builder.paths import Project, local_base_tag
from builder.render import render

WORKDIR = "build/verify"


def _scratch(root: Path, name: str) -> Path:
    workdir = root / WORKDIR / name
    remove_scratch(workdir)  # a killed verify leaves its private storages mounted here
    try:
        workdir.mkdir(parents=True)
    except FileExistsError:
        raise UserError(f"{workdir} is left from an earlier verify and cannot be removed; remove it") from None
    return workdir


def _export_bases(engine: StorageEngine, images: list[str], workdir: Path) -> tuple[Path, ...]:
    engine.check()
    archives = []
    for index, image in enumerate(images):
        if not engine.exists(image):
            raise UserError(f"base image {image} is not in buildah's storage (for the local base: `builder base`)")
        archive = workdir / f"base-{index}.docker.tar"
        engine.save(image, archive)
        archives.append(archive)
    return tuple(archives)


def _twice(engine: StorageEngine, request: BuildRequest, bases: list[str], workdir: Path) -> layer_diff.Comparison:
    try:
        two = layer_diff.build_twice(request, _export_bases(engine, bases, workdir), workdir, engine,
                                     save_when_identical=False)
        if two.identical:
            return layer_diff.Comparison(first_id=two.image_ids[0], second_id=two.image_ids[1])
        return layer_diff.compare(*two.archives)
    finally:
        remove_scratch(workdir)


def verify_stack(stack: Stack, project: Project, engine: StorageEngine) -> layer_diff.Comparison:
    root = project.root
    render.require_rendered(stack, root)
    resolution = check_current(stack, project.lock).resolution
    inputs = context.build_inputs(stack, root, base_pin(stack, resolution))
    progress = Progress.for_environment()
    progress.stage(f"{stack.name}: two builds from empty storage")
    cache = wheel_cache.WheelCache()
    build.fetch_wheels(stack, resolution, cache, offline=False, progress=progress)  # once, for both builds
    build.fetch_debs(stack, resolution, deb_cache.DebCache(), offline=False, progress=progress)
    workdir = _scratch(root, stack.name)
    dockerfile = build.stage_context(inputs, root, resolution, cache, workdir / "context")
    request = build.build_request(stack, workdir / "context", dockerfile, tags.candidate_tag(stack, inputs.hash),
                                  True, progress)
    return _twice(engine, request, [stack.base.image], workdir)


def verify_dockerfile(dockerfile: str, context_path: str, bases: list[str], matrix: Matrix,
                      engine: StorageEngine) -> layer_diff.Comparison:
    path, context_dir = Path(dockerfile).resolve(), Path(context_path).resolve()
    if not path.is_file():
        raise UserError(f"no Dockerfile at {dockerfile}")
    # Built as `builder build` builds: every step with no network (engine/write_once.py).
    request = BuildRequest(
        context_dir=context_dir, dockerfile=path, tags=("localhost/builder-verify:scratch",),
        source_date_epoch=matrix.source_date_epoch,
        build_args={"SOURCE_DATE_EPOCH": str(matrix.source_date_epoch)}, network="none", no_cache=True,
        progress=Progress.for_environment().line,
    )
    return _twice(engine, request, bases or [local_base_tag(matrix.local_base["name"])],
                  _scratch(matrix.root, "dockerfile"))


def export_head(root: Path, destination: Path) -> Path:
    """The committed tree (HEAD), not the working tree: returns the project's directory inside the export."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)

    prefix = git("rev-parse", "--show-prefix")
    if prefix.returncode != 0:
        raise UserError(f"{root} is not in a git work tree: --against-lock builds the committed inputs")
    archive = git("archive", "--format=tar", "HEAD")
    if archive.returncode != 0:
        raise UserError(f"git archive HEAD failed in {root}: {archive.stderr.decode(errors='replace').strip()}")
    destination.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")
    return destination / prefix.stdout.decode().strip()


def _locked_image(engine: StorageEngine, image_id: str, root: Path,
                  report_path: str | None) -> tuple[ImageInfo | None, StorageEngine | None]:
    """The locked image from the engine's storage, or what its committed build report says of it."""
    if engine.exists(image_id):
        return engine.inspect(image_id), engine
    if not report_path or not (root / report_path).is_file():
        return None, None
    try:
        report = build_report.read(root / report_path)
    except ValueError as error:
        raise UserError(f"the locked image's build report: {error}") from None
    if report.image_id != image_id:
        return None, None
    layers = tuple(Layer(layer.diff_id, layer.size, layer.step) for layer in report.layers)
    return ImageInfo(image_id, (), "", {}, layers, report.config), None


def _describe_difference(expected: str, new_id: str, locked: ImageInfo | None, locked_engine: StorageEngine | None,
                         built: ImageInfo, fresh: StorageEngine) -> layer_diff.Comparison:
    comparison = layer_diff.Comparison(first_id=expected, second_id=new_id)
    if locked is None:
        return comparison
    index, step = layer_diff.first_differing_layer(locked.layers, built.layers)
    fields = tuple(f for f in layer_diff.config_differences(dict(locked.config), dict(built.config))
                   if not f.startswith("rootfs")) if locked.config else ()  # the layers say it
    files: tuple[layer_diff.FileDifference, ...] = ()
    if index is not None and locked_engine is not None:
        with locked_engine.mounted(expected) as old_root, fresh.mounted(new_id) as new_root:
            # Both trees at once: hashing them is mostly waiting on the disk (about 80 s each for 11 GB).
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                old_entries, new_entries = pool.map(layer_diff.tree_entries, (old_root, new_root))
            files = layer_diff.diff_entries(old_entries, new_entries)
    return layer_diff.Comparison(expected, new_id, layer_index=index, step=step, files=files, config_fields=fields)


def verify_against_lock(matrix: Matrix, name: str, local_base: bool, engine: StorageEngine) -> layer_diff.Comparison:
    """Build the committed inputs of `name` once, from empty private storage, and compare the image
    with the one the committed matrix.lock records."""
    root = matrix.root
    workdir = _scratch(root, f"against-lock-{name}")
    try:
        export = export_head(root, workdir / "export")
        committed = load_matrix(export / matrix.path.resolve().relative_to(root), local_base=local_base,
                                patches_root=export / "patches")
        stack = committed.select([name], local_base)[0]
        entry = store.read(export / store.FILE_NAME).get(stack.name)
        image = entry.outcome.image if entry else None
        if image is None:
            raise UserError(f"{stack.name}: the committed matrix.lock records no image to verify against")
        render.require_rendered(stack, export)
        resolution = entry.resolution
        inputs = context.build_inputs(stack, export, base_pin(stack, resolution))
        progress = Progress.for_environment()
        fresh = engine.private_storage(workdir / "storage")
        fresh.check()
        built_by, locked_by = fresh.identity(), describe(image.engine)
        progress.stage(f"{stack.name}: one build of HEAD from empty storage with {built_by}, against "
                       f"{image.image_id} (made by {locked_by})")
        cache = wheel_cache.WheelCache()
        build.fetch_wheels(stack, resolution, cache, offline=False, progress=progress)
        build.fetch_debs(stack, resolution, deb_cache.DebCache(), offline=False, progress=progress)
        dockerfile = build.stage_context(inputs, export, resolution, cache, workdir / "context")
        request = build.build_request(stack, workdir / "context", dockerfile, tags.candidate_tag(stack, inputs.hash),
                                      True, progress)
        bases = _export_bases(engine, [stack.base.image], workdir)
        try:
            for archive in bases:
                loaded = fresh.load(archive)
                if stack.base.local and inputs.base_pin and loaded != inputs.base_pin:
                    raise BuildFailure(f"{stack.name}: the base in buildah's storage is {loaded}, the committed "
                                       f"lock records {inputs.base_pin}: run `builder base`")
            # The builder's own build, written once into the private storage's layout: its id to compare,
            # its layers and config to describe a difference, its files where the layers differ.
            new_id = fresh.build(request).image_id
            if new_id == image.image_id:
                return layer_diff.Comparison(first_id=image.image_id, second_id=new_id)
            locked, locked_engine = _locked_image(engine, image.image_id, export, image.report)
            comparison = _describe_difference(image.image_id, new_id, locked, locked_engine, fresh.inspect(new_id),
                                              fresh)
            return replace(comparison, first_engine=f"{locked_by} (matrix.lock)", second_engine=f"{built_by} (this build)")
        finally:
            layer_diff.discard_storage(fresh, fresh.storage_dir)
    finally:
        remove_scratch(workdir)


def report(comparison: layer_diff.Comparison) -> int:
    for line in comparison.describe():
        print(line)
    if comparison.identical:
        return 0
    print("builder: error: the builds differ: not reproducible", file=sys.stderr)
    return 1
