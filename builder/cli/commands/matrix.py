"""`builder matrix`: show the expanded rows."""

from builder.cli import arguments, views


def register(subparsers) -> None:
    parser = subparsers.add_parser("matrix", help="show the expanded stack rows")
    arguments.add_matrix_arguments(parser)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="rows as JSON")
    output.add_argument("--github", action="store_true", help="a GitHub Actions matrix include list")
    parser.set_defaults(func=run)


def run(args) -> int:
    stacks = arguments.load(args).select(args.stack, args.local_base)
    if args.json:
        print(views.as_json(stacks))
    elif args.github:
        print(views.as_github(stacks))
    else:
        print(views.as_table(stacks))
    return 0
