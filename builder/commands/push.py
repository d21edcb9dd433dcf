"""`builder push STACK --registry R`: the immutable tag to a registry, the digest into matrix.lock."""

from builder import cli_common, registry


def register(subparsers) -> None:
    parser = subparsers.add_parser("push", help="push a stack's immutable tag and record its digest")
    cli_common.add_matrix_arguments(parser, stacks=False)
    parser.add_argument("stack", metavar="STACK", help="stack row, as `builder matrix` names it")
    parser.add_argument("--registry", required=True, metavar="R", help="registry host[:port][/namespace]")
    parser.set_defaults(func=run)


def run(args) -> int:
    stack = cli_common.load(args).stack(args.stack)
    pushed = registry.push(stack.name, args.registry)
    print(f"{stack.name}: pushed {pushed['tag']} = {pushed['reference']}")
    return 0
