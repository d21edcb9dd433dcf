"""The write-once build: the builder runs the rendered Dockerfile's steps itself and writes each layer once.

One buildah working container on the base runs every step that needs the image's own programs
(`buildah run --network none`) and receives every COPY (`buildah copy`); after each step the
builder reads what changed through `buildah mount` and writes it as one canonical layer into an OCI
layout (builder/oci/tree_layer.py). The engine never commits a layer and never exports one; the config
and history are the builder's, from the Dockerfile (builder/oci/dockerfile_plan.py), in the form the
canonical export gives an engine-built image, so both paths name one image by one id. The finished
layout is imported into buildah's storage (`buildah pull oci:`), where the smoke checks, tags and
push find it. Only public commands of the engine are used.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engine import canonical
from builder.engine.process import run_quiet, run_streaming
from builder.engine.protocol import BuildRequest, ProgressCallback
from builder.errors import BuildFailure
from builder.oci import dockerfile_plan, tree_layer
from builder.oci.layout import Layout, digest_of

_REF = "image"


@dataclass(frozen=True)
class WrittenImage:
    image_id: str
    layers_written: int
    bytes_written: int
    seconds: float


def _base(buildah: Sequence[str], ref: str) -> dict:
    """The base's OCI config as the storage holds it."""
    output = run_quiet([*buildah, "inspect", "--type", "image", ref], f"buildah inspect {ref}")
    return json.loads(output)["OCIv1"]


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
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _working_container(buildah: Sequence[str], base: str, owner: str) -> Iterator[tuple[str, Path]]:
    name = f"builder-write-once-{owner}-{secrets.token_hex(4)}"
    run_quiet([*buildah, "from", "--pull=never", "--name", name, base], f"buildah from {base}")
    try:
        root = Path(run_quiet([*buildah, "mount", name], f"buildah mount {name}").strip())
        yield name, root
    finally:
        subprocess.run([*buildah, "rm", name], capture_output=True, stdin=subprocess.DEVNULL)


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


def _run_step(buildah: Sequence[str], container: str, root: Path, step: dockerfile_plan.Step, context_dir: Path,
              config: _Config, args: dict[str, str], progress: ProgressCallback | None) -> None:
    env = {**args, **config.env()}
    run_quiet([*buildah, "config", *[a for k, v in env.items() for a in ("--env", f"{k}={v}")], container],
              f"setting the environment of {container}")
    created_targets = []
    argv = [*buildah, "run", "--network", "none"]
    for source, target in step.mounts:
        if not os.path.lexists(root / target.lstrip("/")):
            created_targets.append(root / target.lstrip("/"))
        argv += ["--mount", f"type=bind,src={context_dir / source},dst={target},ro"]
    if config.inner.get("User"):
        argv += ["--user", config.inner["User"]]
    if config.inner.get("WorkingDir"):
        argv += ["--workingdir", config.inner["WorkingDir"]]
    run_streaming([*argv, container, "--", *step.argv], what=f"RUN at Dockerfile line {step.line}",
                  on_line=progress)
    # `buildah build` removes the mount points it made; `buildah run` leaves them.
    for target in created_targets:
        with contextlib.suppress(OSError):
            target.rmdir()


def write_image(buildah: Sequence[str], request: BuildRequest, layout: Layout, workdir: Path, owner: str,
                progress: ProgressCallback | None = None) -> tuple[bytes, list[dict], WrittenImage]:
    """Every step of `request`'s Dockerfile run, each layer written once into `layout`; the image's
    config and layer descriptors (also written to the layout under its one ref)."""
    started = time.monotonic()
    plan = dockerfile_plan.parse(request.dockerfile.read_text(), dict(request.build_args))
    config = _Config(_base(buildah, plan.base))
    base_layers = list(config.diff_ids)
    _base_blobs(buildah, plan.base, base_layers, layout, workdir)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request.source_date_epoch))
    config.data["created"] = created  # `buildah build --timestamp`: the image's time is the build's
    sizes = {diff_id: layout.blob_path(diff_id).stat().st_size for diff_id in base_layers}
    args: dict[str, str] = {}
    written = bytes_written = 0
    build_started = tree_layer.mark(workdir)
    with _working_container(buildah, plan.base, owner) as (container, root):
        before = tree_layer.snapshot(root)
        for step in plan.steps:
            if step.keyword == "ARG":
                args[step.value] = plan.build_args[step.value]
                config.record(step, created, None)
                continue
            if step.empty_layer:
                config.apply(step)
                config.record(step, created, None)
                continue
            since = tree_layer.mark(workdir)
            if step.keyword == "COPY":
                run_quiet([*buildah, "copy", "--quiet", container,
                           *[str(request.context_dir / source) for source in step.sources], step.destination],
                          f"COPY at Dockerfile line {step.line}")
            else:
                _run_step(buildah, container, root, step, request.context_dir, config, args, progress)
            layer, before = tree_layer.write_step_layer(layout, root, since, before, request.source_date_epoch,
                                                        drop_stubs=step.keyword == "RUN",
                                                        build_started_ns=build_started)
            sizes[layer.diff_id] = layer.size
            written, bytes_written = written + 1, bytes_written + layer.size
            config.record(step, created, layer.diff_id)
            if progress:
                progress(f"layer {written}: {layer.diff_id} ({layer.size} bytes, {layer.entries} entries) "
                         f"from line {step.line}")
    data = config.serialised()
    descriptors = [{"mediaType": canonical.LAYER_MEDIA_TYPE, "digest": d, "size": sizes[d]} for d in config.diff_ids]
    layout.write_image(data, descriptors, _REF)
    return data, descriptors, WrittenImage(digest_of(data), written, bytes_written,
                                           round(time.monotonic() - started, 1))


def image_names(buildah: Sequence[str], image_id: str) -> set[str]:
    """Every name of `image_id` in buildah's storage; none when the storage does not hold it."""
    result = subprocess.run([*buildah, "images", "--json", image_id], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, errors="replace")
    if result.returncode != 0:
        return set()
    return {name for image in json.loads(result.stdout or "[]") for name in image.get("names") or ()}


def import_image(buildah: Sequence[str], layout: Layout, image_id: str, tag: str) -> None:
    """The layout's image into buildah's storage under `tag` (layers the storage holds are reused), and
    no other name the import gave it."""
    before = image_names(buildah, image_id)
    pulled = run_quiet([*buildah, "pull", "--quiet", f"oci:{layout.root.name}:{_REF}"], "importing the image",
                       cwd=layout.root.parent).strip().splitlines()
    got = "sha256:" + (pulled[-1] if pulled else "").removeprefix("sha256:")
    if got != image_id:
        raise BuildFailure(f"buildah stored the written image as {got}, expected {image_id}")
    added = image_names(buildah, image_id) - before
    run_quiet([*buildah, "tag", image_id, tag], f"buildah tag {image_id} {tag}")
    for extra in added:
        if extra.removeprefix("localhost/") != tag.removeprefix("localhost/"):
            run_quiet([*buildah, "rmi", extra], f"removing the name {extra}")
