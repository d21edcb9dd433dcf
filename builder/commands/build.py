"""`builder build`: build, smoke-test and tag stacks."""

from builder import build, cli_common


def register(subparsers) -> None:
    parser = subparsers.add_parser("build", help="build, smoke-test and tag stack images reproducibly")
    cli_common.add_matrix_arguments(parser)
    parser.add_argument("--engine", default=build.default_engine(), choices=["buildah", "docker"],
                        help="container engine (default: %(default)s; BUILDER_ENGINE overrides)")
    parser.add_argument("--no-cache", action="store_true", help="build every layer afresh")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = cli_common.load(args)
    stacks = matrix.select(args.stack, args.local_base)
    for outcome in build.build_all(stacks, args.engine, matrix.root, no_cache=args.no_cache):
        print(f"{outcome.stack}: {outcome.immutable_tag} {outcome.image_id}")
    return 0
