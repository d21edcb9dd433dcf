"""Deliver an image from buildah's storage into the Docker daemon, moving only the layers it lacks.

`buildah push IMAGE docker-daemon:TAG` streams every layer, so a one-line patch change used to copy
the whole 11.5 GB image again. Both stores are content-addressed, so the difference is computable:
  1. the daemon holds a layer when one of its images has the same chain of diff_ids up to it
     (the daemon's layer store is keyed by chain id);
  2. `buildah push` to an OCI layout skips any blob whose file already exists there, so a zero-byte
     placeholder per held layer makes it write only the new ones (gzip level 0: no CPU spent on
     compression, and the daemon takes gzip or plain tar alike);
  3. `docker load` of a docker-archive registers a layer only when its chain id is new, and reads
     only those layer files, so the archive carries the config, the manifest and the new layers.
The config blob travels byte for byte, so the image id in the daemon is buildah's. Whatever goes
wrong on the way (a layer removed from the daemon meanwhile, an engine that behaves otherwise), the
caller falls back to the full copy; the id check afterwards holds either way.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from builder.engine.process import run_quiet
from builder.errors import BuildFailure
from builder.oci.layout import Layout, hex_of

OCI_REF = "delivery"


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The daemon's layer keys: chain(1) = diff_id(1), chain(n) = sha256(chain(n-1) + " " + diff_id(n))."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if chains:
            diff_id = "sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest()
        chains.append(diff_id)
    return chains


def held_chains(client) -> set[str]:
    """Every chain id the daemon's images are made of."""
    held: set[str] = set()
    for image in client.images.list(all=True):
        try:
            layers = client.api.inspect_image(image.id).get("RootFS", {}).get("Layers") or []
        except docker.errors.NotFound:
            continue  # removed while we looked
        held.update(chain_ids(layers))
    return held


def layers_to_skip(diff_ids: Sequence[str], held: set[str]) -> set[str]:
    """diff_ids the daemon holds at every position the image uses them (a placeholder stands for a
    diff_id wherever it occurs, so a layer repeated at a position the daemon lacks must travel)."""
    positions: dict[str, list[bool]] = {}
    for diff_id, chain in zip(diff_ids, chain_ids(diff_ids)):
        positions.setdefault(diff_id, []).append(chain in held)
    return {diff_id for diff_id, present in positions.items() if all(present)}


@dataclass(frozen=True)
class Delivery:
    layers: int
    layers_moved: int
    bytes_moved: int


def deliver_new_layers(buildah: list[str], image_id: str, diff_ids: Sequence[str], skip: set[str],
                       tag: str, load: Callable[[object], None], workdir: Path) -> Delivery:
    """Push `image_id` to an OCI layout pre-seeded with placeholders for `skip`, then hand the daemon
    a docker-archive of the config and the layers it lacks through `load` (a binary stream)."""
    with tempfile.TemporaryDirectory(prefix="builder-delivery-", dir=workdir) as scratch:
        layout = Layout.create(Path(scratch))
        blobs = layout.blobs
        for diff_id in skip:
            layout.add_placeholder(diff_id)
        run_quiet(buildah + ["push", "--quiet", "--compression-format", "gzip", "--compression-level", "0",
                             image_id, f"oci:{layout.root}:{OCI_REF}"], f"writing the new layers of {tag}")
        manifest = layout.manifest()
        config = hex_of(manifest["config"]["digest"])
        layer_files = [hex_of(layer["digest"]) for layer in manifest["layers"]]
        if len(layer_files) != len(diff_ids):
            raise BuildFailure(f"{tag}: buildah wrote {len(layer_files)} layers, the image has {len(diff_ids)}")
        moved = [name for name in layer_files if (blobs / name).stat().st_size > 0]
        read_end, write_end = os.pipe()
        writer = threading.Thread(
            target=_write_archive, args=(os.fdopen(write_end, "wb"), blobs, config, layer_files, moved, tag),
        )
        writer.start()
        try:
            with os.fdopen(read_end, "rb") as stream:
                load(stream)
        finally:
            writer.join()
        return Delivery(len(diff_ids), len(moved), sum((blobs / name).stat().st_size for name in moved))


def _write_archive(sink, blobs: Path, config: str, layer_files: list[str], moved: list[str], tag: str) -> None:
    """docker-archive (docker save's format): config, layers, then manifest.json naming every layer;
    the files of held layers are left out, which `docker load` never opens."""
    try:
        with sink, tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            archive.add(blobs / config, arcname=f"{config}.json")
            for name in moved:
                archive.add(blobs / name, arcname=f"{name}.tar")
            manifest = json.dumps([{"Config": f"{config}.json", "RepoTags": [tag],
                                    "Layers": [f"{name}.tar" for name in layer_files]}]).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(manifest)
            archive.addfile(info, io.BytesIO(manifest))
    except BrokenPipeError:
        pass  # the daemon stopped reading; the load's own error says why

