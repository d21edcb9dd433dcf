"""`builder render`: matrix rows -> images/<stack>/."""

import sys

from builder.cli import arguments
from builder.errors import BuildFailure
from builder.render import render


def register(subparsers) -> None:
    parser = subparsers.add_parser("render", help="render Dockerfiles and their context into images/")
    arguments.add_matrix_arguments(parser)
    parser.add_argument("--check", action="store_true", help="fail listing files that are stale instead of writing")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    # Every row on both bases unless narrowed: both variants are committed and reviewed.
    stacks = matrix.select(args.stack, args.local_base) if args.stack or args.local_base else matrix.all_rows()
    files = render.render_all(stacks, matrix.project)
    if args.check:
        stale = render.stale(files, stacks, matrix.root)
        if stale:
            for item in stale:
                print(f"stale: {item}", file=sys.stderr)
            raise BuildFailure(f"{len(stale)} rendered file(s) are stale; run `builder render`")
        print(f"{len(files)} rendered files are up to date")
        return 0
    changed = render.write(files, matrix.root)
    for path in changed:
        print(f"wrote {path}")
    print(f"{len(files)} files rendered, {len(changed)} changed")
    return 0
