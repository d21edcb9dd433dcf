"""`builder lock`: each stack row's pins resolved to hashed distributions on a pinned base, and the
questions a build asks of that resolution (is it current? which requirements? which base digest?)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from builder.config.stack import GROUP_ORDER, Stack
from builder.errors import UserError
from builder.escape import bare
from builder.lock import store
from builder.lock.model import Bench, LockedBase, LockedOverride, LockEntry, Outcome, Resolution
from builder.lock.resolve import WheelResolution, resolve
from builder.lock.system_packages import SystemPackages, version_changes

# (AptSpec) -> the row's locked system packages, read from the archive's signed index.
AptResolver = Callable[..., SystemPackages]


def pins_hash(stack: Stack) -> str:
    """Hash of what a resolution depends on: the python, the pins with their sources, the overrides."""
    inputs = {
        "python": stack.python,
        "packages": [asdict(p) for p in stack.packages],
        "overrides": [asdict(o) for o in stack.overrides],
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def stack_base(stack: Stack, digest: str = "") -> LockedBase:
    return LockedBase(stack.base.name, stack.base.image, stack.base.local).pinned_by(digest)


def _resolution(stack: Stack, wheels: WheelResolution, base: LockedBase,
                system: SystemPackages | None) -> Resolution:
    overrides = tuple(LockedOverride(o.package, stack.package(o.package).version, o.declared_by, o.declared, o.reason)
                      for o in stack.overrides)
    return Resolution(stack.name, pins_hash(stack), wheels.python, wheels.platform, wheels.indexes,
                      wheels.index_strategy, overrides, base, stack.source_date_epoch, wheels.distributions, system)


def lock_stacks(
    stacks: tuple[Stack, ...] | list[Stack],
    path: Path,
    base_resolver: Callable[[str], str],
    apt_resolver: AptResolver,
    resolver: Callable[[Stack], WheelResolution] = resolve,
    references: dict[str, list[dict]] | None = None,
) -> list[str]:
    """Resolve every stack, its registry base's digest (`base_resolver`: image -> manifest digest) and
    its system packages (`apt_resolver`), then record them all in one write: one unreachable index,
    archive or registry and nothing is written. An image built from the same distributions and .debs on
    the same base keeps its record; otherwise the entry starts over at `resolved`. A local base whose
    packages moved loses its digest (`builder base` makes and records the new one). Returns a line per
    stack for the user, with each system package whose version moved."""
    resolved = [(stack, resolver(stack)) for stack in stacks]
    digests = _registry_base_digests(stacks, base_resolver)
    system = _system_packages(stacks, apt_resolver)
    lines: list[str] = []

    def change(lock: store.LockFile) -> None:
        for stack, wheels in resolved:
            previous = lock.get(stack.name)
            debs = system.get(stack.name)
            same_debs = previous is not None and previous.resolution.system_packages == debs
            base = stack_base(stack, digests.get(stack.base.image, ""))
            if stack.base.local and previous and previous.resolution.base.same_base(base) and same_debs:
                base = previous.resolution.base  # what `builder base` made from these packages and recorded
            if debs is not None and not same_debs:
                lines.extend(_moved_lines(stack, previous.resolution.system_packages if previous else None, debs))
            fresh = _resolution(stack, wheels, base, debs)
            unchanged = previous is not None \
                and previous.resolution.distributions_hash == fresh.distributions_hash \
                and previous.resolution.base == fresh.base and same_debs
            references_now = tuple((references or {}).get(stack.name, []))
            if unchanged:
                outcome = replace(previous.outcome, bench=replace(previous.outcome.bench, reference=references_now))
            else:
                outcome = Outcome(bench=Bench(reference=references_now))
            lock.put(LockEntry(fresh, outcome))
            verb = "unchanged" if unchanged else "resolved"
            lines.append(f"{stack.name}: {verb}, {len(fresh.distributions)} distributions "
                         f"({_group_counts(fresh)}), status {outcome.status}")

    store.update(change, path)
    return lines


def _registry_base_digests(stacks, base_resolver: Callable[[str], str]) -> dict[str, str]:
    """{image: manifest digest} of every registry base the stacks name, each asked once."""
    digests: dict[str, str] = {}
    for stack in stacks:
        if not stack.base.local and stack.base.image not in digests:
            try:
                digests[stack.base.image] = base_resolver(stack.base.image)
            except UserError as error:
                raise UserError(f"{stack.name}: {error}; nothing was locked") from None
    return digests


def _system_packages(stacks, apt_resolver: AptResolver) -> dict[str, SystemPackages]:
    """{row: its locked .debs} for every row whose base names system packages, each archive state read once."""
    by_spec: dict = {}
    for stack in stacks:
        if stack.base.apt is not None and stack.base.apt not in by_spec:
            try:
                by_spec[stack.base.apt] = apt_resolver(stack.base.apt)
            except UserError as error:
                raise UserError(f"{stack.name}: {error}; nothing was locked") from None
    return {stack.name: by_spec[stack.base.apt] for stack in stacks if stack.base.apt is not None}


def _moved_lines(stack: Stack, old: SystemPackages | None, new: SystemPackages) -> list[str]:
    """Each system package whose version moved since the last lock (one line when there was none)."""
    if old is None:
        return [f"{stack.name}: {len(new.packages)} system packages locked from "
                f"{', '.join(f'{archive.name} {archive.suite}' for archive in new.archives)}"]
    return [f"{stack.name}: system package {change}" for change in version_changes(old, new)]


def _group_counts(resolution: Resolution) -> str:
    counts = {group: 0 for group in GROUP_ORDER}
    for item in resolution.distributions:
        counts[item.group] += 1
    return ", ".join(f"{group} {count}" for group, count in counts.items())


def base_pin(stack: Stack, resolution: Resolution | None) -> str:
    """The digest the resolution pins the stack's base by (resolved by `builder lock`, or made by
    `builder base`); "" when it records none, or records it for another base."""
    if resolution is None:
        return ""
    recorded = resolution.base
    return recorded.pin if recorded.same_base(stack_base(stack)) else ""


def check_current(stack: Stack, path: Path) -> LockEntry:
    """The stack's entry, refusing one never locked or resolved from other pins than the stack has now."""
    found = store.entry(stack.name, path)
    if found is None:
        raise UserError(f"{stack.name} is not in matrix.lock: run `builder lock --stack {stack.name}`")
    if found.resolution.pins_hash != pins_hash(stack):
        raise UserError(f"{stack.name}: matrix.lock was resolved from other pins than matrix.toml has now; "
                        f"run `builder lock --stack {stack.name}`")
    if stack.base.apt is not None and found.resolution.system_packages is None:
        raise UserError(f"{stack.name}: its system packages are not locked (its archive was unreachable where "
                        f"it was locked); run `builder lock --stack {stack.name}` where it is reachable")
    return found


def recorded_resolutions(path: Path) -> Callable[[Stack], Resolution | None]:
    """Each stack's resolution as the lock records it, None for a stack never locked (one read)."""
    lock = store.read(path)
    return lambda stack: found.resolution if (found := lock.get(stack.name)) else None


def requirements(resolution: Resolution) -> dict[str, str]:
    """{group: requirements.txt text} for pip --no-index --require-hashes --no-deps. One hash per
    distribution, the locked file's: the build's wheel directory holds exactly that file, and pip
    must install nothing else. Where each file came from (index, URL) is the wheel cache's business."""
    texts = {}
    for group in GROUP_ORDER:
        lines = [f"# {resolution.stack}, install group {group}: generated from matrix.lock (`builder lock`).",
                 "# The lock holds the whole closure: install with --no-index --require-hashes --no-deps."]
        for item in resolution.distributions:
            if item.group == group:
                # Each word checked again where it lands (the lock's reader checked them): a requirement
                # line has no quoting, so nothing but a plain word may start another option there.
                lines.append(f"{bare(item.name)}=={bare(item.version)} \\\n    --hash=sha256:{bare(item.sha256)}")
        texts[group] = "\n".join(lines) + "\n"
    return texts


def record_base(base_name: str, image_id: str, path: Path) -> list[str]:
    """The image id `builder base` made the local base with, in every locked stack built on it;
    returns those stacks."""
    updated: list[str] = []

    def change(lock: store.LockFile) -> None:
        for name, found in sorted(lock.stacks.items()):
            base = found.resolution.base
            if base.local and base.name == base_name:
                lock.put(replace(found, resolution=replace(found.resolution, base=base.pinned_by(image_id))))
                updated.append(name)

    store.update(change, path)
    return updated
