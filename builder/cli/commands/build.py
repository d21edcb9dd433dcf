"""`builder build`: build, smoke-test and tag stacks."""

from builder.cli import arguments
from builder.image import build


def register(subparsers) -> None:
    parser = subparsers.add_parser("build", help="build, smoke-test and tag stack images reproducibly")
    arguments.add_matrix_arguments(parser)
    parser.add_argument("--engine", default=build.default_engine(), choices=["buildah", "docker"],
                        help="container engine (default: %(default)s; BUILDER_ENGINE overrides)")
    parser.add_argument("--no-cache", action="store_true", help="build every layer afresh")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stacks = matrix.select(args.stack, args.local_base)
    for outcome in build.build_all(stacks, args.engine, matrix.project, no_cache=args.no_cache):
        print(f"{outcome.stack}: {outcome.immutable_tag} {outcome.image_id}")
    return 0
