"""`builder pin STACK [--bench REPORT ...]`: promote a smoke-tested image and its bench reference figures."""

from builder.cli import arguments
from builder.config import reference_figures
from builder.lock.records import pin_stack


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "pin", help="mark a stack's smoke-tested image as known-good, with its reference bench figures")
    arguments.add_matrix_arguments(parser, stacks=False)
    parser.add_argument("stack", metavar="STACK", help="stack row, as `builder matrix` names it")
    parser.add_argument("--bench", action="append", default=[], metavar="REPORT",
                        help="a bench report (JSON) measured on this image; a regression refuses the pin")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    stack = matrix.stack(args.stack)
    references = reference_figures.load(matrix.project.reference_figures, stacks=matrix.all_rows()).get(stack.name, [])
    pinned = pin_stack(stack.name, references, args.bench, path=matrix.project.lock).outcome
    measured = ", ".join(f"{f.mode} {f.tok_s:.1f} tok/s" for f in pinned.bench.measured) or "none"
    print(f"{stack.name}: pinned image {pinned.pinned.image_id} "
          f"({len(references)} reference figure(s); measured: {measured})")
    return 0
