"""`builder matrix`: show the expanded rows."""

from builder.cli import arguments, views
from builder.lock.resolution import base_pin, recorded_resolutions


def register(subparsers) -> None:
    parser = subparsers.add_parser("matrix", help="show the expanded stack rows")
    arguments.add_matrix_arguments(parser)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="rows as JSON")
    output.add_argument("--github", action="store_true", help="a GitHub Actions matrix include list")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stacks = matrix.select(args.stack, args.local_base)
    if args.json:
        print(views.as_json(stacks))
        return 0
    # Which base digest each row's Dockerfile pins: the lock's, as `builder render` reads it.
    resolution_of = recorded_resolutions(matrix.project.lock)
    digests = {s.name: base_pin(s, resolution_of(s)) for s in stacks}
    print(views.as_github(stacks, digests) if args.github else views.as_table(stacks, digests))
    return 0
