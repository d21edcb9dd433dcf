"""Deliver an image into the Docker daemon (`--load`), moving only the layers it lacks and writing
nothing on the way.

The daemon holds a layer when one of its images has the same chain of diff_ids up to it (its layer
store is keyed by chain id), and `docker load` of a docker-archive registers a layer only when its
chain id is new, reading only those layer files. So the archive carries the config, the manifest and
the new layers, streamed through a pipe from the write-once layout (`deliver_from_layout`), where the
builder wrote every layer as an uncompressed tar named by its diff_id: the image's product, read in
place. (An image the layout does not hold goes whole, through `buildah push`: engine/buildah.py.)
The config travels byte for byte, so the image id in the daemon is the builder's. Whatever goes wrong
on the way (a layer removed from the daemon meanwhile), the caller sends every layer; the id check
afterwards holds either way.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from builder.oci.layout import hex_of

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
    """diff_ids the daemon holds at every position the image uses them (a left-out layer file stands for
    a diff_id wherever it occurs, so a layer repeated at a position the daemon lacks must travel)."""
    positions: dict[str, list[bool]] = {}
    for diff_id, chain in zip(diff_ids, chain_ids(diff_ids)):
        positions.setdefault(diff_id, []).append(chain in held)
    return {diff_id for diff_id, present in positions.items() if all(present)}


@dataclass(frozen=True)
class Delivery:
    layers: int
    layers_moved: int
    bytes_moved: int


def deliver_from_layout(blobs: Path, config: bytes, diff_ids: Sequence[str], skip: set[str], tag: str,
                        load: Callable[[object], None]) -> Delivery | None:
    """Hand the daemon a docker-archive read straight from the write-once layout, where every layer is
    an uncompressed tar named by its diff_id: nothing is written on the way. None when the layout lacks
    a layer the daemon needs (an image the write-once path did not make, or a blob swept since)."""
    sources = {hex_of(diff_id): blobs / hex_of(diff_id) for diff_id in diff_ids if diff_id not in skip}
    if not all(path.is_file() for path in sources.values()):
        return None
    _stream_archive(load, config, [hex_of(diff_id) for diff_id in diff_ids], sources, tag)
    return Delivery(len(diff_ids), len(sources), sum(path.stat().st_size for path in sources.values()))


def _stream_archive(load: Callable[[object], None], config: bytes, layer_names: list[str], sources: dict[str, Path],
                    tag: str) -> None:
    """`load` reads the archive from a pipe while a thread writes it: nothing of it lands on disk here."""
    read_end, write_end = os.pipe()
    writer = threading.Thread(target=_write_archive,
                              args=(os.fdopen(write_end, "wb"), config, layer_names, sources, tag))
    writer.start()
    try:
        with os.fdopen(read_end, "rb") as stream:
            load(stream)
    finally:
        writer.join()


def _write_archive(sink, config: bytes, layer_names: list[str], sources: dict[str, Path], tag: str) -> None:
    """docker-archive (docker save's format): config, layers, then manifest.json naming every layer;
    the files of held layers (not in `sources`) are left out, which `docker load` never opens."""
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    try:
        with sink, tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            _add_bytes(archive, config_name, config)
            for name, path in sources.items():
                archive.add(path, arcname=f"{name}.tar")
            _add_bytes(archive, "manifest.json", json.dumps([{
                "Config": config_name, "RepoTags": [tag], "Layers": [f"{name}.tar" for name in layer_names],
            }]).encode())
    except BrokenPipeError:
        pass  # the daemon stopped reading; the load's own error says why


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))
