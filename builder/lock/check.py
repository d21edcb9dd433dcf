"""`builder lock --check`: does matrix.lock still describe what the tree builds?

A lock goes stale silently when the inputs change after an image was recorded: a patch, an in-image
tool, a rendered file, the base or SOURCE_DATE_EPOCH. For every row with a recorded image this
compares the inputs hash the tree gives now (the caller's `inputs_of`, builder/build_stack/context.py's
one function) with the recorded one, naming the part that moved; a pinned image that the current
inputs cannot make is named as such. Rows resolved from other pins than the matrix has now are stale
too. Rows never locked are reported, not failed: some cannot be locked where their indexes are
unreachable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from builder.config.stack import Stack
from builder.errors import UserError
from builder.lock import build_report, deb_listing, store
from builder.lock.model import STATUS_PINNED, ImageRecord, Resolution
from builder.lock.resolution import base_pin, pins_hash
from builder.paths import stack_dir

_FILES_NAMED = 5


class InputFile(Protocol):
    path: str
    mode: int
    sha256: str


class Inputs(Protocol):
    """What the check needs of a row's current build inputs."""

    hash: str
    base_pin: str
    source_date_epoch: int
    files: tuple[InputFile, ...]


def _changed_files(root: Path, image: ImageRecord, inputs: Inputs) -> list[str]:
    """Files whose content or mode moved since the build, from the build report's list when it is there."""
    try:
        recorded = {f.path: (f.mode, f.sha256) for f in build_report.read(root / image.report).files}
    except (OSError, ValueError):
        return []
    current = {f.path: (f.mode, f.sha256) for f in inputs.files}
    return sorted(path for path in recorded.keys() | current.keys() if recorded.get(path) != current.get(path))


def _why(stack: Stack, root: Path, image: ImageRecord, inputs: Inputs) -> str:
    if stack.base.local and image.base.pin and not inputs.base_pin:
        return (f"the local base's locked packages moved since {image.base.pin} was made; "
                f"`builder base` makes and records the new one")
    if image.base.pin != inputs.base_pin:
        return f"base pin {image.base.pin or 'unpinned'} -> {inputs.base_pin or 'unpinned'}"
    if image.source_date_epoch != inputs.source_date_epoch:
        return f"SOURCE_DATE_EPOCH {image.source_date_epoch} -> {inputs.source_date_epoch}"
    changed = _changed_files(root, image, inputs)
    if changed:
        more = f" and {len(changed) - _FILES_NAMED} more" if len(changed) > _FILES_NAMED else ""
        return f"changed: {', '.join(changed[:_FILES_NAMED])}{more}"
    return "the Dockerfile or the copied files changed"


def _stale_debs(stack: Stack, root: Path, resolution: Resolution) -> str | None:
    """A row whose system packages the lock does not hold as the matrix asks, or whose rendered list of
    .debs is not the lock's; None when they agree. (A local base made from other packages shows as a
    moved base digest: `builder lock` clears the digest when the base's packages move.)"""
    if stack.base.apt is None:
        return None
    locked = resolution.system_packages
    if tuple(sorted(locked.requested)) != stack.base.apt.packages:
        return "its system packages are not locked as matrix.toml names them"
    if not stack.base.system_packages:
        return None
    path = root / stack_dir(stack) / deb_listing.DEBS_FILE
    rendered = path.read_text(encoding="utf-8") if path.is_file() else ""
    return deb_listing.stale(rendered, locked)


def stale_rows(stacks: tuple[Stack, ...], root: Path, path: Path,
               inputs_of: Callable[[Stack, Path, str], Inputs]) -> tuple[list[str], list[str]]:
    """(problems, notes): one line per stale row, and one per row with nothing to check.
    `inputs_of(stack, root, base digest)` gives the row's current build inputs. No lock at all is
    refused (UserError): there is nothing the tree could be current against."""
    if not Path(path).is_file():
        raise UserError(f"{path}: no lock to check; run `builder lock` and commit {Path(path).name}")
    lock = store.read(path)
    problems, notes = [], []
    for stack in stacks:
        found = lock.get(stack.name)
        if found is None:
            notes.append(f"{stack.name}: not locked")
            continue
        if found.resolution.pins_hash != pins_hash(stack):
            problems.append(f"{stack.name}: resolved from other pins than matrix.toml has now; "
                            f"run `builder lock --stack {stack.name}`")
            continue
        if stack.base.apt is not None and found.resolution.system_packages is None:
            notes.append(f"{stack.name}: wheels locked, system packages not locked (its archive was unreachable "
                         f"where it was locked); `builder build` refuses it")
            continue
        debs = _stale_debs(stack, root, found.resolution)
        if debs:
            problems.append(f"{stack.name}: {debs}; run `builder lock --stack {stack.name}` then `builder render`")
            continue
        image = found.outcome.image
        if image is None:
            notes.append(f"{stack.name}: locked, no image recorded")
            continue
        try:
            inputs = inputs_of(stack, root, base_pin(stack, found.resolution))
        except UserError as error:
            problems.append(f"{stack.name}: recorded image {image.image_id} but its inputs cannot be read: {error}")
            continue
        if image.inputs_hash == inputs.hash:
            continue
        what = "pinned image" if found.outcome.status == STATUS_PINNED else "recorded image"
        problems.append(f"{stack.name}: {what} {image.image_id} was built from other inputs than the tree has now "
                        f"({_why(stack, root, image, inputs)}); rebuild it and commit matrix.lock")
    return problems, notes
