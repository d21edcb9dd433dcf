"""`builder pull STACK [--registry R]`: pull by the digest matrix.lock records, and check it."""

from builder.cli import arguments
from builder.publish import registry


def register(subparsers) -> None:
    parser = subparsers.add_parser("pull", help="pull a stack's image by digest and check it against matrix.lock")
    arguments.add_matrix_arguments(parser, stacks=False)
    parser.add_argument("stack", metavar="STACK", help="stack row, as `builder matrix` names it")
    parser.add_argument("--registry", metavar="R",
                        help="registry host[:port][/namespace] (default: the one the stack was pushed to)")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stack = matrix.stack(args.stack)
    pulled = registry.pull(stack.name, args.registry, lock_path=matrix.project.lock)
    print(f"{stack.name}: {pulled.reference} is {pulled.image_id}, tagged {pulled.tag}")
    return 0
