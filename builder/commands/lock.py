"""`builder lock`: resolve stack pins to hashed distributions in matrix.lock."""

from builder import baselines, cli_common, lock


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "lock", help="resolve pins to the full hashed closure (uv) and record it in matrix.lock")
    cli_common.add_matrix_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = cli_common.load(args)
    # Every row on both bases unless narrowed, as `builder render` renders them all.
    stacks = matrix.select(args.stack, args.local_base) if args.stack or args.local_base else matrix.all_rows()
    for line in lock.lock_stacks(stacks, references=baselines.load(stacks=matrix.all_rows())):
        print(line)
    return 0
