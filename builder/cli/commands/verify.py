"""`builder verify`: build twice from an empty cache and compare digests."""

from builder.cli import arguments
from builder.engine import storage_engine
from builder.errors import UserError
from builder.verify import verify


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify", help="build a stack (or any Dockerfile) twice from an empty cache and compare digests",
        description="Build twice, each time in empty buildah storage holding only the base image, and "
        "compare the image digests. On a mismatch, name the first differing layer (with the step that "
        "made it) and the files that differ in it; exit 1.")
    parser.add_argument("stack", nargs="?", help="stack row to verify")
    arguments.add_matrix_arguments(parser, stacks=False)
    parser.add_argument("--against-lock", action="store_true",
                        help="build the stack once from the committed inputs (HEAD, not the working tree) and "
                             "compare with the image matrix.lock records; exit 1 naming the difference")
    parser.add_argument("--dockerfile", help="verify this Dockerfile instead of a stack's")
    parser.add_argument("--context", default=".", help="build context for --dockerfile (default: %(default)s)")
    parser.add_argument("--base", action="append", default=[], metavar="IMAGE",
                        help="base image(s) the --dockerfile builds FROM (default: the local base)")
    parser.set_defaults(func=run)


def run(args) -> int:
    if bool(args.stack) == bool(args.dockerfile):
        raise UserError("give a stack or --dockerfile, not both or neither")
    if args.against_lock and not args.stack:
        raise UserError("--against-lock needs a stack")
    engine = storage_engine()
    if args.against_lock:
        comparison = verify.verify_against_lock(arguments.load(args), args.stack, args.local_base, engine)
    elif args.stack:
        matrix = arguments.load(args)
        comparison = verify.verify_stack(matrix.select([args.stack], args.local_base)[0], matrix.project, engine)
    else:
        comparison = verify.verify_dockerfile(args.dockerfile, args.context, args.base, arguments.load(args), engine)
    return verify.report(comparison)
