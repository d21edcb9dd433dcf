"""What a `builder` run that died left behind: its smoke containers and candidate tags.

Both are found by the owner they carry (engine/ownership.py): through the Docker API (Docker's daemon,
or podman's service over buildah's storage), and, for the candidate tags of the images the builder
wrote, among the refs of its OCI layout. A run sweeps what dead runs of this host left before it
builds; its watchdog (engine/reaper.py) sweeps its own when it dies mid-run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from builder.engine.ownership import OWNER_LABEL, Owner
from builder.oci.layout import Layout


@dataclass(frozen=True)
class Swept:
    containers: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.containers or self.tags)

    def describe(self) -> str:
        parts = [f"container {name}" for name in self.containers] + [f"tag {tag}" for tag in self.tags]
        return ", ".join(parts)


def sweep(client: docker.DockerClient, belongs: Callable[[Owner], bool], layout: Path | None = None) -> Swept:
    """Remove every labelled container and every candidate tag whose owner `belongs` says to take, from
    the API's store and from `layout`'s refs; nothing unmarked is ever touched. Removing a tag of an
    image with other names only untags it."""
    tags = sweep_refs(layout, belongs) if layout is not None else []
    containers = []
    for container in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        owner = Owner.from_label((container.labels or {}).get(OWNER_LABEL, ""))
        if owner is not None and belongs(owner):
            _ignore_gone(lambda: container.remove(force=True))
            containers.append(container.name)
    for image in client.images.list():
        for tag in image.tags:
            owner = Owner.from_candidate_tag(tag)
            if owner is not None and belongs(owner):
                _ignore_gone(lambda: client.api.remove_image(tag))
                tags.append(tag)
    return Swept(tuple(containers), tuple(sorted(set(tags))))


def sweep_refs(layout: Path, belongs: Callable[[Owner], bool]) -> list[str]:
    """Remove, in one index write, every candidate ref of `layout` whose owner `belongs` says to take."""
    refs = Layout(layout)
    taken = [name for name in refs.ref_names()
             if (owner := Owner.from_candidate_tag(name)) is not None and belongs(owner)]
    refs.remove_refs(taken)
    return taken


def of_dead_runs(owner: Owner) -> bool:
    return owner.is_gone()


def _ignore_gone(remove: Callable[[], object]) -> None:
    try:
        remove()
    except docker.errors.NotFound:
        pass  # already gone: auto-removed, or swept by another run
