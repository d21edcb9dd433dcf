"""What a `builder` run that died left behind: its smoke containers and candidate tags.

Both are found through the Docker API (Docker's daemon, or podman's service over buildah's storage)
by the owner they carry (engine/ownership.py). A run sweeps what dead runs of this host left before
it builds; its watchdog (engine/reaper.py) sweeps its own when it dies mid-run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors

from builder.engine.ownership import OWNER_LABEL, Owner


@dataclass(frozen=True)
class Swept:
    containers: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.containers or self.tags)

    def describe(self) -> str:
        parts = [f"container {name}" for name in self.containers] + [f"tag {tag}" for tag in self.tags]
        return ", ".join(parts)


def sweep(client: docker.DockerClient, belongs: Callable[[Owner], bool]) -> Swept:
    """Remove every labelled container and every candidate tag whose owner `belongs` says to take;
    nothing unmarked is ever touched. Removing a tag of an image with other names only untags it."""
    containers = []
    for container in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        owner = Owner.from_label((container.labels or {}).get(OWNER_LABEL, ""))
        if owner is not None and belongs(owner):
            _ignore_gone(lambda: container.remove(force=True))
            containers.append(container.name)
    tags = []
    for image in client.images.list():
        for tag in image.tags:
            owner = Owner.from_candidate_tag(tag)
            if owner is not None and belongs(owner):
                _ignore_gone(lambda: client.api.remove_image(tag))
                tags.append(tag)
    return Swept(tuple(containers), tuple(sorted(tags)))


def of_dead_runs(owner: Owner) -> bool:
    return owner.is_gone()


def _ignore_gone(remove: Callable[[], object]) -> None:
    try:
        remove()
    except docker.errors.NotFound:
        pass  # already gone: auto-removed, or swept by another run
