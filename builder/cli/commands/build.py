"""`builder build`: build, smoke-test and tag stacks."""

from builder.build_stack import build
from builder.cli import arguments
from builder.engine import get_engine


def register(subparsers) -> None:
    parser = subparsers.add_parser("build", help="build, smoke-test and tag stack images reproducibly")
    arguments.add_matrix_arguments(parser)
    arguments.add_engine_argument(parser)
    parser.add_argument("--no-cache", action="store_true", help="build every layer afresh")
    parser.add_argument("--offline", action="store_true",
                        help="no network at all: every locked wheel must already be in the wheel cache "
                             "(`builder fetch`); local-base rows only")
    parser.add_argument("--load", action="store_true",
                        help="also put the passed image into the Docker daemon (as buildx --load); by default "
                             "it stays in the builder's layout only (`builder push` and `builder smoke` read it there)")
    parser.add_argument("--resmoke", action="store_true",
                        help="run the smoke checks even when matrix.lock holds a pass for this exact image id")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stacks = matrix.select(args.stack, args.local_base)
    # Delivering nowhere: --load asks this engine for its loader once the image passed.
    engine = get_engine(args.engine, export_to_docker=False)
    outcomes = build.build_all(stacks, engine, matrix.project, no_cache=args.no_cache, offline=args.offline,
                               resmoke=args.resmoke, load=args.load)
    for outcome in outcomes:
        print(f"{outcome.stack}: {outcome.immutable_tag} {outcome.image_id}")
    return 0
