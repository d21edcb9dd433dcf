"""`builder build`: rendered stack -> image on a real engine -> smoke gate -> tags, report, lock.

The engine gets a context assembled from exactly the files the inputs hash covers (builder/build_stack/context.py),
so one set of inputs names one image. A build lands under a candidate tag; the immutable tag must not
already name another image (builder/build_stack/immutable.py); only when the smoke checks pass does the
immutable tag point at it and the moving tag move. A failed build or smoke test leaves every
existing tag where it was. What the image is (report, SBOM) is tracked and reproducible; how this
run went (commit, host, times) goes to the provenance record, which is not.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from builder.build_stack import context, immutable, provenance, sbom, wheel_plans
from builder.cache import deb_cache, wheel_cache
from builder.config import tags
from builder.config.stack import Stack
from builder.engine.image_container import ImageSource
from builder.engine.progress import Progress
from builder.engine.protocol import BuildRequest, BuildResult, Engine
from builder.errors import BuildFailure, UserError
from builder.lock import records
from builder.lock import debian_archive
from builder.lock.build_report import BuildReport, InputFile, ReportLayer
from builder.lock.model import ImageRecord, LockEntry, Resolution
from builder.lock.resolution import base_pin, check_current
from builder.lock.smoke_report import SmokeReport
from builder.lock.system_packages import SystemPackages
from builder.paths import DEBS_CONTEXT_DIR, WHEELS_CONTEXT_DIR, Project, cache_root, layer_listings_dir, project_relative
from builder.render import render
from builder.smoke import keyed_gate, keyed_results, smoke_gate, smoke_host
from builder.smoke.image_files import ImageFiles
from builder.smoke.keyed_results import KeyedResults

@dataclass(frozen=True)
class BuildOutcome:
    stack: str
    image_id: str
    immutable_tag: str
    moving_tag: str
    report_path: Path
    provenance_path: Path
    durations_s: dict


def build_request(stack: Stack, context_dir: Path, dockerfile: Path, candidate: str, no_cache: bool,
                  progress: Progress) -> BuildRequest:
    """Every row builds with no network: wheels and .debs come from the host's cache through the context,
    so online and offline builds give one image (the engines write /etc/hosts and resolv.conf stubs into
    RUN layers only when a network is attached)."""
    return BuildRequest(
        context_dir=context_dir,
        dockerfile=dockerfile,
        tags=(candidate,),
        source_date_epoch=stack.source_date_epoch,
        build_args={"SOURCE_DATE_EPOCH": str(stack.source_date_epoch)},
        network="none",
        platform=stack.platform,
        no_cache=no_cache,
        progress=progress.line,
    )


def fetch_wheels(stack: Stack, resolution: Resolution, cache: wheel_cache.WheelCache, offline: bool,
                 progress: Progress) -> wheel_cache.FillReport:
    """Every locked wheel into the host's cache before the engine starts; --offline only checks."""
    wheels = wheel_cache.locked_wheels(resolution)
    if offline:
        cache.require(wheels, stack.name)
        return wheel_cache.FillReport(len(wheels), 0, 0)
    absent = len(cache.missing(wheels))
    if absent:
        progress.stage(f"{stack.name}: fetching {absent} of {len(wheels)} locked wheels into {cache.root}")
    return cache.fill(wheels, resolution.python, stack.name)


def added_debs(resolution: Resolution) -> SystemPackages | None:
    """The .debs the row's own system packages step installs (None on the local base, which carries its own)."""
    locked = resolution.system_packages
    return locked if locked is not None and locked.scope == "added" else None


def fetch_debs(stack: Stack, resolution: Resolution, debs: deb_cache.DebCache, offline: bool,
               progress: Progress) -> deb_cache.DebFillReport:
    """Every .deb the row's system packages step installs into the host's cache; --offline only checks."""
    locked = added_debs(resolution)
    if locked is None:
        return deb_cache.DebFillReport(0, 0, 0, 0)
    if offline:
        debs.require(locked, stack.name)
        return deb_cache.DebFillReport(len(locked.packages), 0, 0, 0)
    absent = len(debs.missing(locked))
    if absent:
        progress.stage(f"{stack.name}: fetching {absent} of {len(locked.packages)} locked .debs into {debs.root}")
    return debs.fill(locked, stack.name, lambda: debian_archive.fetch_sources(stack.base.apt))


def stage_context(inputs: context.BuildInputs, root: Path, resolution: Resolution, cache: wheel_cache.WheelCache,
                  context_dir: Path, debs: deb_cache.DebCache | None = None) -> Path:
    """The engine's context: exactly the hashed files, the entry's wheels and each install group's plan
    for the install steps' read-only mount (their hashes are in the hashed requirements and the plans) and, for a row that adds system packages, its
    locked .debs (their hashes are in debs.txt). Returns the Dockerfile."""
    dockerfile = context.assemble(inputs, root, context_dir)
    cache.link_into(wheel_cache.locked_wheels(resolution), context_dir / WHEELS_CONTEXT_DIR)
    wheel_plans.stage_plans(resolution, cache, context_dir / WHEELS_CONTEXT_DIR)
    locked = added_debs(resolution)
    if locked is not None:
        (debs or deb_cache.DebCache()).link_into(locked, context_dir / DEBS_CONTEXT_DIR)
    return dockerfile


def check_base(stack: Stack, engine: Engine, pin: str) -> None:
    """A local base is known by a tag, so the image id behind it must be the one the lock records."""
    if not stack.base.local:
        return
    if not pin:
        raise UserError(f"{stack.name}: matrix.lock records no image id for the local base: run `builder base`")
    held = engine.image_id(stack.base.image)
    if held is None:
        raise UserError(f"{stack.name}: base image {stack.base.image} is not in {engine.name}: run `builder base`")
    if held != pin:
        raise UserError(f"{stack.name}: base image {stack.base.image} is {held} in {engine.name}, matrix.lock "
                        f"records {pin}: run `builder base` (it records the image id it makes)")


def write_report(path: Path, stack: Stack, inputs: context.BuildInputs, result: BuildResult, config: dict,
                 smoke_report: SmokeReport, tag_names: list[str]) -> None:
    """What the image is (builder/lock/build_report.py): the same image rewrites the same bytes."""
    BuildReport(
        stack=stack.name, engine=result.engine, engine_identity=result.identity, image_id=result.image_id,
        tags=tuple(tag_names), source_date_epoch=stack.source_date_epoch, inputs_hash=inputs.hash,
        base=f"{inputs.base_reference}@{inputs.base_pin or 'unpinned'}",
        files=tuple(InputFile(f.path, f.mode, f.sha256) for f in inputs.files),
        layers=tuple(ReportLayer(layer.diff_id, layer.size, layer.created_by) for layer in result.layers),
        config=dict(config), smoke=smoke_report,
    ).write(path)


def _build_in_context(engine: Engine, stack: Stack, inputs: context.BuildInputs, root: Path,
                      resolution: Resolution, cache: wheel_cache.WheelCache, candidate: str, no_cache: bool, progress: Progress) -> BuildResult:
    # Beside the wheel cache, so the wheels are hard-linked into the context rather than copied.
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="builder-context-", dir=cache.root) as scratch:
        context_dir = Path(scratch) / "context"
        dockerfile = stage_context(inputs, root, resolution, cache, context_dir)
        return engine.build(build_request(stack, context_dir, dockerfile, candidate, no_cache, progress))


def _answered(entry: LockEntry, image_id: str | None, stack: Stack, sbom_file: Path, resmoke: bool) -> bool:
    """Whether the lock's smoke pass and the SBOM already answer for `image_id`: then no container runs."""
    return (not resmoke and image_id is not None and recorded_smoke(entry, image_id) is not None
            and sbom.made_for(sbom_file, stack.name, image_id))


def recorded_smoke(entry: LockEntry, image_id: str) -> SmokeReport | None:
    """The passing smoke report the lock already holds for exactly this image, if any."""
    smoke = entry.outcome.smoke
    if smoke and smoke.image_id == image_id and smoke.passed and smoke.report is not None:
        return smoke.report
    return None


@dataclass(frozen=True)
class SmokeAnswer:
    report: SmokeReport
    answers: Mapping[str, Mapping[str, object]] | None  # the keyed gate's runs, for the committed file


def _smoke(stack: Stack, entry: LockEntry, image_id: str, candidate: str, resmoke: bool, progress: Progress,
           durations: dict, host: smoke_host.SmokeHost, engine: Engine, committed: Path,
           source: Callable[[], ImageSource | str]) -> SmokeAnswer:
    """The checks run in the candidate, unless the lock holds a pass for this very image id: the id is
    the image's content, so running them again could only repeat that answer (--resmoke does anyway).
    Where the engine keeps the layers' tars, each check runs only when something it read before changed
    (smoke/keyed_gate.py), answered first by this host's runs, then by the committed ones; elsewhere all
    of them run. `source` gives what the checks' containers are made from (the candidate's root, or its tag)."""
    known = None if resmoke else recorded_smoke(entry, image_id)
    if known is not None:
        progress.stage(f"{stack.name}: smoke checks passed before for {image_id} (matrix.lock); --resmoke runs them")
        durations["smoke"] = 0.0
        return SmokeAnswer(known, None)
    progress.stage(f"{stack.name}: smoke checks in {candidate}")
    started = time.monotonic()
    layers = engine.layer_tars(image_id)
    answers = None
    if layers is None:
        report = smoke_gate.run_in_image(source(), client=host.client, labels=host.labels())
    else:
        files = ImageFiles(layers, layer_listings_dir())
        outcome = keyed_gate.run(source(), image_id, stack.name, files, engine.inspect(image_id).config,
                                 KeyedResults(cache_root() / "smoke-reads" / stack.name, committed), host.client,
                                 host.labels(), resmoke)
        report, answers = outcome.report, outcome.answers
        if outcome.reused:
            progress.stage(f"{stack.name}: smoke checks answered by an earlier run, nothing they read having "
                           f"changed: {', '.join(outcome.reused)}; run: {', '.join(outcome.ran) or 'none'}")
    durations["smoke"] = round(time.monotonic() - started, 1)
    progress.block(report.table())
    # Recorded under the image id: the candidate tag names this run's process, so a record keeping it
    # would change with every run of the same image.
    return SmokeAnswer(replace(report, image=image_id), answers)


def build_stack(stack: Stack, engine: Engine, progress: Progress, project: Project, no_cache: bool = False,
                cache: wheel_cache.WheelCache | None = None, offline: bool = False,
                resmoke: bool = False, load: bool = False) -> BuildOutcome:
    """Builds in the engine's own storage and smoke-tests there; the Docker daemon gets the image only
    with `load` (smoke_host.py: no second copy by default)."""
    with smoke_host.open_host(engine, progress) as host:
        return _build_stack(stack, engine, progress, project, no_cache, cache, offline, resmoke, load, host)


def _build_stack(stack: Stack, engine: Engine, progress: Progress, project: Project, no_cache: bool,
                 cache: wheel_cache.WheelCache | None, offline: bool, resmoke: bool, load: bool,
                 host: smoke_host.SmokeHost) -> BuildOutcome:
    root, lock_path = project.root, project.lock
    cache = cache or wheel_cache.WheelCache()
    render.require_rendered(stack, root)
    entry = check_current(stack, lock_path)
    resolution = entry.resolution
    pin = base_pin(stack, resolution)
    check_base(stack, engine, pin)
    inputs = context.build_inputs(stack, root, pin)
    # The run's own candidate: the owner in the tag lets the next run sweep it if this one dies.
    candidate = tags.candidate_tag(stack, inputs.hash) + host.owner.tag_suffix()
    immutable_tag, moving = tags.immutable_tag(stack, inputs.hash), tags.moving_tag(stack)
    report_path = project.reports / f"{stack.name}.json"
    committed_reads = keyed_results.committed_path(project.reports, stack.name)
    sbom_file = sbom.sbom_path(report_path)
    if not _answered(entry, engine.image_id(immutable_tag), stack, sbom_file, resmoke):
        host.start()  # containers will run: the service starts beside the build
    started_on, started = datetime.now(timezone.utc), time.monotonic()
    fetched = fetch_wheels(stack, resolution, cache, offline, progress)
    fetched_debs = fetch_debs(stack, resolution, deb_cache.DebCache(), offline, progress)
    durations = {"fetch_wheels": round(time.monotonic() - started, 1)}
    progress.stage(f"{stack.name}: building {immutable_tag}")
    result = _build_in_context(engine, stack, inputs, root, resolution, cache, candidate, no_cache, progress)
    durations.update(build=result.duration_s, deliver_to_docker=result.deliver_s)
    # `--load`, as buildx: the engine's own answer (None where it builds in the Docker daemon already).
    loader = engine.docker_loader() if load else None
    # The SBOM asks the image itself (two short containers): asked while the smoke checks run, written
    # only once they pass.
    asking = ThreadPoolExecutor(1, thread_name_prefix="sbom-inventory")
    # What the inventory's and the checks' containers are made from: the image's root, stacked from the
    # layout's layer trees where the engine wrote it (none is extracted unless a container runs), else
    # the candidate tag in the engine's storage.
    source = functools.cache(lambda: engine.layout_image(result.image_id) or candidate)
    inventory = None
    try:
        if not _answered(entry, result.image_id, stack, sbom_file, resmoke):
            host.ready()  # a container API that does not answer fails the run before any tag moves
        if resmoke or not sbom.made_for(sbom_file, stack.name, result.image_id):
            inventory = asking.submit(sbom.take_inventory, source(), host.client, labels=host.labels())
        for store in (engine, loader) if loader else (engine,):
            immutable.check(store, immutable_tag, result.image_id, result.identity, entry.outcome.image)
        smoked = _smoke(stack, entry, result.image_id, candidate, resmoke, progress, durations, host, engine,
                        committed_reads, source)
        smoke_result = smoked.report
        if not smoke_result.passed:
            records.record_smoke(stack.name, smoke_result, image_id=result.image_id, path=lock_path)
            raise BuildFailure(f"{stack.name}: smoke checks failed; {immutable_tag} not tagged")
        engine.tag(candidate, immutable_tag)
        engine.tag(candidate, moving)
    finally:
        asking.shutdown(wait=True)  # its containers gone before the candidate's name goes
        engine.remove(candidate)
    delivered = result.delivered_bytes
    if loader:
        loaded = time.monotonic()
        delivered = loader.load_into_docker(result, [immutable_tag, moving])
        durations["deliver_to_docker"] = round(time.monotonic() - loaded, 1)
    write_report(report_path, stack, inputs, result, engine.inspect(result.image_id).config, smoke_result,
                 [immutable_tag, moving])
    if smoked.answers is not None:
        keyed_results.write_committed(committed_reads, smoked.answers)
    # No inventory: the SBOM already made for this image id stands (sbom.write_bom's `reuse`).
    sbom_path = sbom_file if inventory is None else \
        sbom.write_bom(sbom_file, stack.name, result.image_id, resolution, inventory=inventory.result())
    durations["total"] = round(time.monotonic() - started, 1)
    statement = provenance.statement(
        inputs, image_id=result.image_id, immutable_tag=immutable_tag, engine=engine.name,
        engine_version=engine.version(), source=provenance.source_state(root), distributions=resolution.distributions,
        started=started_on, finished=datetime.now(timezone.utc), durations_s=durations,
        external={"engine": engine.name, "no_cache": no_cache, "local_base": stack.base.local, "offline": offline,
                  "wheels_downloaded": fetched.downloaded, "wheel_bytes_downloaded": fetched.downloaded_bytes,
                  "debs_downloaded": fetched_debs.downloaded, "deb_bytes_downloaded": fetched_debs.downloaded_bytes,
                  "delivered_bytes": delivered, "layers_written": result.written_layers,
                  "layer_bytes_written": result.written_bytes, "layers_reused": result.reused_layers},
    )
    provenance_path = provenance.write(report_path, statement)
    records.record_build(stack.name, ImageRecord(
        image_id=result.image_id, immutable_tag=immutable_tag, tags=(immutable_tag, moving), inputs_hash=inputs.hash,
        base=resolution.base, source_date_epoch=stack.source_date_epoch, report=project_relative(report_path, root),
        provenance=project_relative(provenance_path, root), sbom=project_relative(sbom_path, root),
        engine=result.identity,
    ), smoke_result, lock_path)
    progress.stage(f"{stack.name}: {immutable_tag} = {result.image_id} ({durations['total']} s; wheels downloaded: "
                   f"{fetched.downloaded_bytes} bytes; delivered to Docker: {delivered} bytes)")
    return BuildOutcome(stack.name, result.image_id, immutable_tag, moving, report_path, provenance_path, durations)


def build_all(stacks: tuple[Stack, ...], engine: Engine, project: Project, no_cache: bool = False,
              offline: bool = False, resmoke: bool = False, load: bool = False) -> list[BuildOutcome]:
    """`engine` delivers nowhere (the CLI's get_engine(..., export_to_docker=False)): `load` asks it for a loader."""
    if not stacks:
        raise UserError("no stack selected")
    engine.check()
    progress = Progress.for_environment()
    cache = wheel_cache.WheelCache()
    return [build_stack(stack, engine, progress, project, no_cache, cache, offline, resmoke, load) for stack in stacks]

