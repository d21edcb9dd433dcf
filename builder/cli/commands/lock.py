"""`builder lock`: resolve stack pins to hashed distributions in matrix.lock; `--check` says whether the
lock still describes what the tree builds."""

import sys

from builder.cli import arguments
from builder.config import reference_figures
from builder.image import context
from builder.lock import check as lock_check
from builder.lock.resolution import lock_stacks
from builder.publish import base_digest


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "lock", help="resolve pins to the full hashed closure (uv) and record it in matrix.lock")
    arguments.add_matrix_arguments(parser)
    parser.add_argument("--check", action="store_true",
                        help="resolve nothing; exit 1 naming each row whose recorded image or resolution "
                             "no longer matches the tree's inputs")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    # Every row on both bases unless narrowed, as `builder render` renders them all.
    stacks = matrix.select(args.stack, args.local_base) if args.stack or args.local_base else matrix.all_rows()
    if args.check:
        return check(stacks, matrix)
    figures = reference_figures.load(matrix.project.reference_figures, stacks=matrix.all_rows())
    for line in lock_stacks(stacks, path=matrix.project.lock, base_resolver=base_digest.resolve, references=figures):
        print(line)
    return 0


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
