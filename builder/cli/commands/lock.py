"""`builder lock`: resolve stack pins to hashed distributions and system packages in matrix.lock;
`--check` says whether the lock still describes what the tree builds."""

import os
import sys

from builder.base.local_base import BaseSpec
from builder.build_stack import context
from builder.cli import arguments
from builder.cli.commands import base
from builder.config import reference_figures
from builder.engine import get_engine
from builder.lock import check as lock_check
from builder.lock import store
from builder.lock import base_digest, debian_archive
from builder.lock.resolution import base_pin, lock_stacks
from builder.paths import local_base_tag


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "lock", help="resolve pins to the full hashed closure (uv) and record it in matrix.lock")
    arguments.add_matrix_arguments(parser)
    parser.add_argument("--check", action="store_true",
                        help="resolve nothing; exit 1 naming each row whose recorded image or resolution "
                             "no longer matches the tree's inputs")
    parser.add_argument("--no-base", action="store_true",
                        help="when the local base's packages moved, do not make it again (`builder base` does, "
                             "and records its digest)")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    # Every row on both bases unless narrowed, as `builder render` renders them all.
    stacks = matrix.select(args.stack, args.local_base) if args.stack or args.local_base else matrix.all_rows()
    if args.check:
        return check(stacks, matrix)
    figures = reference_figures.load(matrix.project.reference_figures, stacks=matrix.all_rows())
    before = _local_base_pin(stacks, matrix.project.lock)
    for line in lock_stacks(stacks, path=matrix.project.lock, base_resolver=base_digest.resolve,
                            apt_resolver=debian_archive.resolve, references=figures):
        print(line)
    if before is not None and _local_base_pin(stacks, matrix.project.lock) == "":
        _remake_base(matrix, before, args.no_base)
    return 0


def _local_base_pin(stacks, path) -> str | None:
    """The base pin (an image id) the lock records for the local base (None: no selected row is on it)."""
    lock = store.read(path)
    for stack in stacks:
        if stack.base.local:
            found = lock.get(stack.name)
            return base_pin(stack, found.resolution if found else None)
    return None


def _remake_base(matrix, before: str, skip: bool) -> None:
    """The base's packages moved (or were never made): its new image id, made from the new lock."""
    name = matrix.local_base["name"]
    if skip or os.geteuid() != 0:
        print(f"{name} base: no image id for its locked packages; run `builder base` to make it and record it")
        return
    spec = BaseSpec(source_date_epoch=matrix.source_date_epoch, suite=matrix.local_base["suite"],
                    packages=tuple(matrix.local_base["packages"]), tag=local_base_tag(name))
    image_id = base.make_and_record(spec, matrix, matrix.project.root / "build" / "base", get_engine("buildah"))
    print(f"{name} base: {before or 'none'} -> {image_id}")


def check(stacks, matrix) -> int:
    path = matrix.project.lock
    problems, notes = lock_check.stale_rows(stacks, matrix.root, path, context.build_inputs)
    for line in notes:
        print(line)
    for line in problems:
        print(f"builder: error: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"{path.name}: current for {len(stacks) - len(notes)} of {len(stacks)} rows")
    return 0
