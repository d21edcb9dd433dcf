"""The write-once build: the builder runs the rendered Dockerfile's steps itself and writes each layer once.

The image's layers, each indexed once for mounting with its tar blob as the data (an EROFS index kept
by diff_id, builder/oci/layer_index.py: no copy of its files), are stacked by overlayfs under a fresh upper directory (overlay_mount.py): the root every step that
needs the image's own programs runs on, by the OCI runtime with no network (step_runner.py), and every
COPY writes into (builder/oci/context_copy.py). After each step the builder reads what changed and
writes it as one canonical layer into an OCI layout (builder/oci/tree_layer.py). The wheel groups'
install steps are not run: their layers are written from the groups' plans straight from the wheels
(builder/oci/wheel_layer.py). No engine runs a step, commits a layer or exports one; buildah only
hands over the base. The config and history are the builder's, from the Dockerfile
(builder/oci/dockerfile_plan.py), in the canonical form (builder/oci/canonical.py) an engine-built image
is put in to prove the Dockerfile is the spec (canonical_preview.py), so both paths name one image by one
id. The finished image stays in the layout: its home.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import gzip
import json
import os
import posixpath
import secrets
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from builder.engine import compile_beside, overlay_mount, staging, step_runner
from builder.engine.compile_beside import INSTALL_TOOL
from builder.engine.image_names import image_names
from builder.engine.process import run_quiet
from builder.engine.protocol import BuildRequest, ProgressCallback
from builder.errors import BuildFailure
from builder.files import TEMP_SUFFIX, locked
from builder.oci import canonical, context_copy
from builder.oci import dockerfile_plan, layer_listing, step_cache, tree_layer, wheel_layer
from builder.oci.layer_index import LayerIndex, LayerIndexes
from builder.oci.layout import Layout, digest_of, linked_layout
from builder.paths import layer_listings_dir

_REF = "image"
# What buildah leaves in the layer of a RUN step with a bind mount besides the step's own changes (1.28.2
# and 1.39.3 alike, whatever the mount's target): the image's /run, as the base has it.
_BIND_MOUNT_LEAVES = ("run",)


@dataclass(frozen=True)
class WrittenImage:
    image_id: str
    config: bytes
    layers: tuple[dict, ...]  # the layer descriptors, base first
    layers_written: int
    layers_reused: int  # found in the step cache: not run, not written
    bytes_written: int
    seconds: float


def _base(buildah: Sequence[str], ref: str) -> tuple[str, dict]:
    """The base's image id and OCI config as the storage holds them."""
    output = json.loads(run_quiet([*buildah, "inspect", "--type", "image", ref], f"buildah inspect {ref}"))
    image_id = output["FromImageID"]
    return (image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"), output["OCIv1"]


def _base_blobs(buildah: Sequence[str], ref: str, diff_ids: Sequence[str], layout: Layout, workdir: Path) -> None:
    """The base's layers into `layout`, uncompressed (blob digest = diff_id), as the engine pushes them:
    never rewritten. Skipped when the layout holds them already."""
    if all(layout.has_blob(diff_id) for diff_id in diff_ids):
        return
    scratch = workdir / f"base-{secrets.token_hex(8)}"
    try:
        run_quiet([*buildah, "push", "--quiet", "--disable-compression", ref, f"oci:{scratch}:base"],
                  f"reading the base {ref}")
        pushed = Layout(scratch)
        # buildah may reuse a compressed blob it knows for a layer whatever --disable-compression says:
        # its decompressed stream must then be the layer itself (the layout's writer checks the diff_id).
        for diff_id, descriptor in zip(diff_ids, pushed.manifest("base")["layers"], strict=True):
            if layout.has_blob(diff_id):
                continue
            with pushed.open_blob(descriptor["digest"], verify=True) as stored:
                source = gzip.GzipFile(fileobj=stored) if descriptor["mediaType"].endswith("gzip") else stored
                layout.write_blob_from(source, expected=diff_id)
            # Listed now, as the layers the build writes are: the smoke gate's view then reads no tar.
            layer_listing.listing(layout.blob_path(diff_id), diff_id, layer_listings_dir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def in_use(root: Path, sweep: bool = False) -> Iterator[list[str]]:
    """The store held for the block, shared: builds, imports and pushes over one store run side by side
    (a lock file, freed by the kernel when its holder dies). With `sweep`, what killed builds left goes
    first, but only where no one else holds the store: a live build's temporaries cannot be told from a
    dead one's, so beside a running build they wait for the next build that finds itself alone. Yields
    what was swept."""
    root.mkdir(parents=True, exist_ok=True)
    swept = _sweep_if_alone(root) if sweep else []
    # Between the two locks another holder may come in: it finds nothing of this build yet.
    with locked(root / "lock", fcntl.LOCK_SH):
        yield swept


def _sweep_if_alone(root: Path) -> list[str]:
    try:
        with locked(root / "lock", fcntl.LOCK_EX | fcntl.LOCK_NB):
            return sweep_leftovers(Layout.create(root / "layout"), root)
    except BlockingIOError:
        return []  # another build, import or push holds the store


def sweep_leftovers(store: Layout, root: Path) -> list[str]:
    """What a killed build left, under the lock: its half-written blobs and indexes, its runtime
    containers and mounts, its scratch. Returns what went."""
    swept = _runner(root).sweep() + overlay_mount.sweep(_roots(root)) + _indexes(root).sweep()
    # Where builds before the indexes extracted each layer: gigabytes nothing reads any more.
    shutil.rmtree(root / "trees", ignore_errors=True)
    for path in [*store.blobs.glob(f".*{TEMP_SUFFIX}"), *scratch_dir(root).iterdir()]:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        swept.append(path.name)
    return swept + staging.sweep()


def _runner(root: Path) -> step_runner.StepRunner:
    return step_runner.StepRunner(root / "runtime", scratch_dir(root))


def _indexes(root: Path) -> LayerIndexes:
    return LayerIndexes(indexes_dir(root))


def indexes_dir(root: Path) -> Path:
    """Where the layers' indexes are kept (oci/layer_index.py), beside the layout whose blobs they mount."""
    return root / "indexes"


def _roots(root: Path) -> Path:
    """Where the steps' stacked roots are mounted."""
    return root / "roots"


class _OwnRoot:
    """The root the steps that need the image's own programs run on: the layers so far stacked under a
    fresh upper directory. It is stacked again after a layer the builder wrote without
    it (a wheel group), whose files it lacks."""

    def __init__(self, store: Layout, indexes: LayerIndexes, scratch: Path) -> None:
        self.store, self.indexes, self.scratch = store, indexes, scratch
        self._mount: contextlib.ExitStack | None = None
        self.stack: overlay_mount.Stack | None = None

    def lowers(self, diff_ids: Sequence[str]) -> list[LayerIndex]:
        """The layers as they mount, indexed where not yet."""
        return [self.indexes.index(self.store, diff_id) for diff_id in diff_ids]

    def start(self, lowers: Sequence[LayerIndex], after_run: bool) -> None:
        """On the layers `lowers`; `after_run`: a RUN step came before, so the engine's stubs are made
        first (step_runner.engine_stubs)."""
        self.close()
        self._mount = contextlib.ExitStack()
        self.stack = self._mount.enter_context(overlay_mount.stacked(lowers, self.scratch))
        if after_run:
            step_runner.engine_stubs(self.stack.merged)

    def close(self) -> None:
        if self._mount is not None:
            self._mount.close()
            self._mount, self.stack = None, None


def _planned_install(step: dockerfile_plan.Step, context_dir: Path) -> tuple[Path, Path] | None:
    """Where on the host the plan and the wheels of a wheel group's install step are (the template's
    `install_wheels.py install PLAN WHEEL_DIR`, both read through the step's bind mount), or None for
    any other step. Such a step's layer is written from the plan, without running it."""
    if step.keyword != "RUN" or len(step.argv) != 7 or list(step.argv[1:5]) != ["-I", "-B", INSTALL_TOOL, "install"]:
        return None
    found = []
    for in_image in step.argv[5:]:
        for source, target in step.mounts:
            if in_image == target or (posixpath.normpath(in_image) == in_image and in_image.startswith(target + "/")):
                found.append(context_dir / source / in_image[len(target):].lstrip("/"))
                break
        else:
            return None
    return found[0], found[1]


class _Config:
    """The image config as the Dockerfile's metadata steps leave it (buildah's rules: an ENV name
    set again moves to the end; ENTRYPOINT clears an inherited CMD)."""

    def __init__(self, base: dict) -> None:
        self.data = copy.deepcopy(base)
        self.inner = self.data.setdefault("config", {})
        self.history = list(self.data.get("history") or [])
        self.base_history = len(self.history)
        self.diff_ids = list((self.data.get("rootfs") or {}).get("diff_ids") or [])

    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.inner.get("Env") or [] if "=" in item)

    def apply(self, step: dockerfile_plan.Step) -> None:
        if step.keyword == "ENV":
            env = self.inner.get("Env") or []
            for key, value in step.pairs:
                env = [item for item in env if item.split("=", 1)[0] != key] + [f"{key}={value}"]
            self.inner["Env"] = env
        elif step.keyword == "LABEL":
            self.inner["Labels"] = {**(self.inner.get("Labels") or {}), **dict(step.pairs)}
        elif step.keyword == "WORKDIR":
            self.inner["WorkingDir"] = step.value
        elif step.keyword == "USER":
            self.inner["User"] = step.value
        elif step.keyword == "EXPOSE":
            ports = dict(self.inner.get("ExposedPorts") or {})
            ports.update({(p if "/" in p else f"{p}/tcp"): {} for p in step.value.split()})
            self.inner["ExposedPorts"] = ports
        elif step.keyword == "ENTRYPOINT":
            self.inner["Entrypoint"] = list(step.argv)
            self.inner.pop("Cmd", None)
        elif step.keyword == "CMD":
            self.inner["Cmd"] = list(step.argv)

    def record(self, step: dockerfile_plan.Step, created: str, diff_id: str | None) -> None:
        entry = {"created": created, "created_by": step.created_by}
        if step.empty_layer:
            entry["empty_layer"] = True
        self.history.append(entry)
        if diff_id is not None:
            self.diff_ids.append(diff_id)

    def serialised(self) -> bytes:
        self.data["history"] = self.history
        return canonical.canonical_config(self.data, self.diff_ids, self.base_history)


def _copied_to(step: dockerfile_plan.Step) -> str | None:
    """Where a COPY step writes (its destination, relative to the root; the parser makes it absolute):
    all its layer can hold besides the parents. None for a RUN step, or a COPY to the root itself."""
    if step.keyword != "COPY":
        return None
    return posixpath.normpath(step.destination).strip("/") or None


def _run_step(runner: step_runner.StepRunner, root: Path, step: dockerfile_plan.Step, context_dir: Path,
              config: _Config, args: dict[str, str], progress: ProgressCallback | None, background: bool = False) -> None:
    runner.run(root, step.argv, {**args, **config.env()}, config.inner.get("User"), config.inner.get("WorkingDir"),
               [(context_dir / source, target) for source, target in step.mounts],
               what=f"RUN at Dockerfile line {step.line}", on_line=progress, background=background)


class _Beside:
    """The byte-compile step run on a root of its own beside the step before it (compile_beside.py):
    started with that step, its layer taken only when that step's layer cannot have changed it."""

    def __init__(self, index: int, reads: compile_beside.CompileReads, future: Future) -> None:
        self.index, self.reads, self.future = index, reads, future

    def layer(self, store: Layout, between: tree_layer.WrittenLayer) -> tuple[tree_layer.WrittenLayer | None, str]:
        """The compile's layer and '' where it holds on top of `between`; else None and why not."""
        try:
            layer = self.future.result()
        except (BuildFailure, OSError) as failure:  # it runs again in its place, where a failure is the build's
            return None, f"it failed beside it ({str(failure).splitlines()[0]})"
        reason = compile_beside.difference(self.reads, store.blob_path(between.diff_id),
                                           store.blob_path(layer.diff_id), [row[0].lstrip("/") for row in layer.listing])
        return (layer, "") if reason is None else (None, reason)


def _step_on_own_stack(store: Layout, lowers: Sequence[LayerIndex], roots: Path, workdir: Path,
                       runner: step_runner.StepRunner, step: dockerfile_plan.Step, request: BuildRequest,
                       config: _Config, args: dict[str, str], after_run: bool) -> tree_layer.WrittenLayer:
    """`step` run in the background (on the CPU time other steps leave) on `lowers` stacked under an upper directory of its own, and its
    layer written; the build's root is left alone."""
    build_started = tree_layer.mark(workdir)
    with overlay_mount.stacked(lowers, roots) as stack:
        if after_run:
            step_runner.engine_stubs(stack.merged)
        before = tree_layer.snapshot(stack.upper)
        since = tree_layer.mark(workdir)
        _run_step(runner, stack.merged, step, request.context_dir, config, args, None, background=True)
        layer, _ = tree_layer.write_step_layer(store, stack.merged, stack.upper, since, before,
                                               request.source_date_epoch, drop_stubs=True,
                                               build_started_ns=build_started, lowers=stack.lowers)
    return layer


def step_keys(plan: dockerfile_plan.Plan, base_id: str, epoch: int, context_dir: Path,
              memo: step_cache.DigestMemo) -> list[str]:
    """Each step's cache key (builder/oci/step_cache.py): the chain of every step up to it, with the
    content of what COPY and the bind mounts read from the context."""
    keys, key = [], step_cache.first_key(base_id, epoch)
    for step in plan.steps:
        reads = [*step.sources, *(source for source, _ in step.mounts)]
        argument = plan.build_args.get(step.value, "") if step.keyword == "ARG" else ""
        key = step_cache.chain(key, step.created_by, argument,
                               *(step_cache.tree_digest(context_dir / source, memo) for source in reads))
        keys.append(key)
    return keys


def write_image(buildah: Sequence[str], request: BuildRequest, root: Path, progress: ProgressCallback | None = None,
                ) -> WrittenImage:
    """Every step of `request`'s Dockerfile that the cache does not hold run (or, for a wheel group,
    written from its plan), each layer written once into the layout under `root`. The longest cached
    prefix of steps is not run: the first step to run starts on the stack of its layers. The image's
    config and layers are in the result."""
    started = time.monotonic()
    store, workdir, indexes = Layout.create(root / "layout"), scratch_dir(root), _indexes(root)
    cache, memo = step_cache.StepCache(root / "steps"), step_cache.DigestMemo(root / "digests.json")
    plan = dockerfile_plan.parse(request.dockerfile.read_text(), request.build_arguments())
    base_id, base_config = _base(buildah, plan.base)
    config = _Config(base_config)
    base_layers = list(config.diff_ids)
    _base_blobs(buildah, plan.base, base_layers, store, workdir)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.source_date_epoch))
    config.data["created"] = created  # `buildah build --timestamp`: the image's time is the build's
    sizes = {diff_id: store.blob_path(diff_id).stat().st_size for diff_id in base_layers}
    keys = step_keys(plan, base_id, request.source_date_epoch, request.context_dir, memo)
    args: dict[str, str] = {}
    reused = _replay_cached(plan, keys, cache, store, config, created, args, sizes, no_cache=request.no_cache)
    first_to_run = reused.steps
    if progress:
        layer_steps = sum(not step.empty_layer for step in plan.steps)
        progress(f"layer cache: {reused.layers} of {layer_steps} layers reused")
    written = bytes_written = 0
    own_root = _OwnRoot(store, indexes, _roots(root))
    runner = _runner(root)
    current = False  # whether the root holds every layer so far
    before: dict = {}
    build_started = 0
    groups = _GroupWriter(store, indexes, request, memo)
    beside_pool = ThreadPoolExecutor(1, thread_name_prefix="beside")
    beside: _Beside | None = None
    layer = None
    try:
        for index in range(first_to_run, len(plan.steps)):
            groups.start(index, plan.steps[index])
        for index in range(first_to_run, len(plan.steps)):
            step = plan.steps[index]
            if _applied_without_layer(plan, step, config, args, created):
                continue
            previous, layer, how = layer, groups.written(index), " (written from its wheel plan)"
            if beside is not None and beside.index == index:
                layer, why_not = beside.layer(store, previous)
                how = f" (run beside line {plan.steps[index - 1].line})"
                if layer is None and progress:
                    progress(f"line {step.line}: run again on top of line {plan.steps[index - 1].line}: {why_not}")
            if layer is not None:
                current = False
            else:
                how = ""
                if not current:
                    stacking = time.monotonic()
                    lowers = own_root.lowers(config.diff_ids)
                    # Before the stack: every directory of its upper directory is born after this mark
                    # (tree_layer tells one made again from one kept by its birth too).
                    build_started = tree_layer.mark(workdir)
                    own_root.start(lowers, any(s.keyword == "RUN" for s in plan.steps[:index]))
                    if progress and len(config.diff_ids) > len(base_layers):
                        progress(f"root on the {len(config.diff_ids)} layers so far "
                                 f"({time.monotonic() - stacking:.1f} s)")
                    before, current = tree_layer.snapshot(own_root.stack.upper), True
                since = tree_layer.mark(workdir)
                if step.keyword == "COPY":
                    context_copy.copy_into(own_root.stack.merged, [request.context_dir / source for source in step.sources],
                                           step.destination)
                else:
                    beside = _start_beside(beside_pool, plan, index, config, store, own_root, workdir, runner,
                                           request, args) or beside
                    _run_step(runner, own_root.stack.merged, step, request.context_dir, config, args, progress)
                layer, before = tree_layer.write_step_layer(store, own_root.stack.merged, own_root.stack.upper, since, before,
                                                            request.source_date_epoch,
                                                            drop_stubs=step.keyword == "RUN",
                                                            build_started_ns=build_started,
                                                            under=_copied_to(step), lowers=own_root.stack.lowers)
            cache.record(keys[index], step_cache.CachedLayer(layer.diff_id, layer.size))
            # Listed as written: the smoke gate's view of the image then reads no tar for it.
            layer_listing.keep(layer_listings_dir(), layer.diff_id, list(layer.listing))
            sizes[layer.diff_id] = layer.size
            written, bytes_written = written + 1, bytes_written + layer.size
            config.record(step, created, layer.diff_id)
            if progress:
                progress(f"layer {len(config.diff_ids)}: {layer.diff_id} ({layer.size} bytes, "
                         f"{layer.entries} entries) from line {step.line}{how}")
    finally:
        groups.close()
        beside_pool.shutdown(wait=True)  # a step beside a failed one ends before its root goes
        own_root.close()
    memo.save()
    data = config.serialised()
    descriptors = tuple(canonical.layer_descriptors(config.diff_ids, sizes))
    return WrittenImage(digest_of(data), data, descriptors, written, reused.layers, bytes_written,
                        round(time.monotonic() - started, 1))


def _start_beside(pool: ThreadPoolExecutor, plan: dockerfile_plan.Plan, index: int, config: _Config, store: Layout,
                  own_root: _OwnRoot, workdir: Path, runner: step_runner.StepRunner, request: BuildRequest,
                  args: dict[str, str]) -> _Beside | None:
    """The byte-compile step started beside the RUN step `index` when it comes right after it."""
    following = index + 1
    if following >= len(plan.steps):
        return None
    reads = compile_beside.compile_reads(plan.steps[following], config.env())
    if reads is None:
        return None
    lowers, step = own_root.lowers(config.diff_ids), plan.steps[following]
    # As the step will find them: nothing between the two steps changes them.
    settings, step_args = copy.deepcopy(config), dict(args)
    return _Beside(following, reads, pool.submit(
        _step_on_own_stack, store, lowers, own_root.scratch, workdir, runner, step, request, settings, step_args,
        after_run=True))


class _GroupWriter:
    """The wheel groups' layers, written on worker threads ahead of the steps that take them: each is
    read from its plan and its wheels alone, so it waits neither for the steps before it nor for the
    other groups, and the groups share the cores (zlib, hashing and the writes let go of the GIL)."""

    def __init__(self, store: Layout, indexes: LayerIndexes, request: BuildRequest, memo: step_cache.DigestMemo) -> None:
        self.store, self.indexes, self.request, self.memo = store, indexes, request, memo
        self.futures: dict[int, Future] = {}
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(min(2, os.cpu_count() or 1), thread_name_prefix="wheel-layer")

    def start(self, index: int, step: dockerfile_plan.Step) -> None:
        """Begin writing step `index`'s layer if it installs a wheel group."""
        planned = _planned_install(step, self.request.context_dir)
        if planned is not None:
            self.futures[index] = self.pool.submit(self._write, *planned)

    def _write(self, plan_file: Path, wheel_dir: Path) -> tree_layer.WrittenLayer:
        layer = wheel_layer.write_planned_layer(
            self.store, wheel_layer.WheelPlan.from_json(plan_file.read_bytes(), str(plan_file)), wheel_dir,
            self.request.source_date_epoch, lambda path: self.memo.file_digest(path, path.stat()),
            directories=_BIND_MOUNT_LEAVES, stop=self.stop)
        # Indexed here, while the tar is in the page cache: the next container step stacks it.
        self.indexes.index(self.store, layer.diff_id)
        return layer

    def written(self, index: int) -> tree_layer.WrittenLayer | None:
        """Step `index`'s layer once written, or None for a step that installs no wheel group."""
        future = self.futures.pop(index, None)
        return None if future is None else future.result()

    def close(self) -> None:
        """Stop what is under way (a build that failed elsewhere leaves only temporary blobs, removed)."""
        self.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class _Reused:
    steps: int  # the steps before the first one that must run
    layers: int


def _replay_cached(plan: dockerfile_plan.Plan, keys: Sequence[str], cache: step_cache.StepCache, store: Layout,
                   config: _Config, created: str, args: dict[str, str], sizes: dict[str, int],
                   no_cache: bool) -> _Reused:
    """The steps up to the first whose layer the cache lacks, applied to `config` without running."""
    layers = 0
    for index, step in enumerate(plan.steps):
        if _applied_without_layer(plan, step, config, args, created):
            continue
        hit = None if no_cache else cache.get(keys[index])
        if hit is None or not store.has_blob(hit.diff_id):
            return _Reused(index, layers)
        sizes[hit.diff_id] = hit.size
        config.record(step, created, hit.diff_id)
        layers += 1
    return _Reused(len(plan.steps), layers)


def _applied_without_layer(plan: dockerfile_plan.Plan, step: dockerfile_plan.Step, config: _Config,
                           args: dict[str, str], created: str) -> bool:
    """ARG and the metadata steps, applied to the build arguments or the config, and recorded in the
    history; False (nothing done) for a step that makes a layer."""
    if step.keyword == "ARG":
        if step.value in plan.build_args:
            args[step.value] = plan.build_args[step.value]
    elif step.empty_layer:
        config.apply(step)
    else:
        return False
    config.record(step, created, None)
    return True


def scratch_dir(root: Path) -> Path:
    """The build's scratch under `root`, beside the layout (imports hard-link its blobs), made if missing."""
    workdir = root / "tmp"
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def build_into_layout(buildah: Sequence[str], request: BuildRequest, root: Path) -> WrittenImage:
    """The write-once build under `root` (its layout, indexes, layer cache and scratch): the image's layers
    and config in the layout. Call it under exclusive(root), after the sweep."""
    written = write_image(buildah, request, root, request.progress)
    store = Layout(root / "layout")
    # The config beside the layers: the layout then holds the whole image.
    if not store.has_blob(written.image_id):
        store.write_blob(written.config, expected=written.image_id)
    return written


def import_image(buildah: Sequence[str], store: Layout, config: bytes, layers: Sequence[dict], workdir: Path,
                 tag: str, stored: set[str] | frozenset[str] = frozenset()) -> str:
    """The image of `config` and `layers` (blobs in `store`) into buildah's storage under `tag`, and no
    other name the import gave it; layers the storage holds are reused. Returns the image id.
    The import reads a layout of its own whose blobs are hard links to the store's, so builds that
    share the store never write one index. The engine stages the layers not in `stored` (the digests
    known to be in the storage already) in memory where they fit (staging.py)."""
    image_id = digest_of(config)
    before = image_names(buildah, image_id)
    new_bytes = sum(layer["size"] for layer in layers if layer["digest"] not in stored)
    with linked_layout(store, workdir, [layer["digest"] for layer in layers]) as view, \
            staging.staging_environment(new_bytes) as env:
        view.write_image(config, list(layers), _REF)
        pulled = run_quiet([*buildah, "pull", "--quiet", f"oci:{view.root.name}:{_REF}"], "importing the image",
                           cwd=view.root.parent, env=env).strip().splitlines()
    got = "sha256:" + (pulled[-1] if pulled else "").removeprefix("sha256:")
    if got != image_id:
        raise BuildFailure(f"buildah stored the written image as {got}, expected {image_id}")
    added = image_names(buildah, image_id) - before
    run_quiet([*buildah, "tag", image_id, tag], f"buildah tag {image_id} {tag}")
    for extra in added:
        if extra.removeprefix("localhost/") != tag.removeprefix("localhost/"):
            run_quiet([*buildah, "rmi", extra], f"removing the name {extra}")
    return image_id
