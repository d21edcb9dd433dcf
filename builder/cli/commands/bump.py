"""`builder bump PACKAGE==VERSION ... --from STACK [--name NEW]`: a candidate stack for new upstream
versions, written next to STACK (never over it), with a verdict for each patch and a report."""

from __future__ import annotations

from packaging.utils import canonicalize_name

from builder.bump import run as bump_run
from builder.bump.newer import newest_beyond_stacks
from builder.config.matrix import load_matrix
from builder.errors import UserError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bump", help="write a candidate stack for new upstream versions, with patch verdicts and a report")
    parser.add_argument("pins", nargs="*", metavar="PACKAGE==VERSION", help="the new versions")
    parser.add_argument("--from", dest="from_stack", metavar="STACK", help="the stack to start from")
    parser.add_argument("--name", help="the candidate's name (default: STACK with the bumped version)")
    parser.add_argument("--matrix", default="matrix.toml", help="version matrix (default: %(default)s)")
    parser.add_argument("--no-lock", action="store_true", help="write the stack and report; lock and render nothing")
    parser.add_argument("--report", metavar="CANDIDATE",
                        help="only write the report of an earlier bump again (image sizes, smoke results)")
    parser.add_argument("--newer", metavar="PACKAGE",
                        help="only say whether the default index has a PACKAGE newer than every stack's "
                             "(prints `pin=PACKAGE==VERSION` and `from=STACK`, or nothing)")
    parser.add_argument("--github-output", metavar="FILE",
                        help="append the candidate's name and its rows whose wheels all come from the default "
                             "index (candidate=, default_index_rows=) to FILE, e.g. $GITHUB_OUTPUT")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.newer:
        if args.pins or args.from_stack or args.report:
            raise UserError("--newer takes no PACKAGE==VERSION, --from or --report")
        found = newest_beyond_stacks(load_matrix(args.matrix), args.newer)
        if found:
            print(f"pin={canonicalize_name(args.newer)}=={found[0]}\nfrom={found[1]}")
        return 0
    if args.report:
        if args.pins or args.from_stack:
            raise UserError("--report takes no PACKAGE==VERSION or --from")
        outcome = bump_run.report(args.matrix, args.report)
    else:
        if not args.from_stack:
            raise UserError("give --from STACK")
        outcome = bump_run.bump(args.matrix, args.pins, args.from_stack, args.name, lock=not args.no_lock)
    for line in outcome.lines:
        print(line)
    print(outcome.text, end="")
    print(f"wrote {outcome.report}")
    if args.github_output:
        rows = bump_run.default_index_rows(args.matrix, outcome.name)
        with open(args.github_output, "a", encoding="utf-8") as handle:
            handle.write(f"candidate={outcome.name}\ndefault_index_rows={' '.join(rows)}\n")
    return 0
