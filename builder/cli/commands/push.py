"""`builder push STACK --registry R`: the immutable tag to a registry, the digest into matrix.lock."""

from builder.cli import arguments
from builder.engine import storage_engine
from builder.publish import registry


def register(subparsers) -> None:
    parser = subparsers.add_parser("push", help="push a stack's immutable tag and record its digest")
    arguments.add_matrix_arguments(parser, stacks=False)
    parser.add_argument("stack", metavar="STACK", help="stack row, as `builder matrix` names it")
    parser.add_argument("--registry", required=True, metavar="R", help="registry host[:port][/namespace]")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stack = matrix.stack(args.stack)
    pushed = registry.push(stack.name, args.registry, lock_path=matrix.project.lock, engine=storage_engine())
    print(f"{stack.name}: pushed {pushed.tagged} = {pushed.reference}")
    return 0
