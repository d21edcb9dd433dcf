"""`builder patches check|refresh`: the patch series against real upstream wheels."""

from __future__ import annotations

import argparse

from builder.cli import arguments
from builder.errors import UserError
from builder.patches import patch_series
from builder.paths import Project


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "patches", help="check the patch series against upstream, or refresh one for a new version"
    )
    actions = parser.add_subparsers(dest="patches_action", required=True, metavar="ACTION")

    check = actions.add_parser(
        "check",
        help="apply each series to its exact upstream wheel in a temporary directory",
        description="Without --stack or --package, checks every series under patches/.",
    )
    arguments.add_matrix_arguments(check)
    check.add_argument("--package", help="distribution name, e.g. sglang")
    check.add_argument("--version", help="the distribution's version, e.g. 0.5.9")
    check.set_defaults(func=run_check)

    refresh = actions.add_parser(
        "refresh", help="regenerate a series against a new upstream version where it applies cleanly"
    )
    refresh.add_argument("--package", required=True, help="distribution name, e.g. sglang")
    refresh.add_argument("--from", dest="from_version", required=True, help="version with a series")
    refresh.add_argument("--to", dest="to_version", required=True, help="new upstream version")
    refresh.add_argument("--matrix", default="matrix.toml",
                         help="the project's matrix; its directory holds patches/ (default: %(default)s)")
    refresh.set_defaults(func=run_refresh)


def _selected(args: argparse.Namespace, patches_root) -> list[tuple[str, str]]:
    if args.stack and (args.package or args.version):
        raise UserError("give --stack or --package/--version, not both")
    if bool(args.package) != bool(args.version):
        raise UserError("--package and --version go together")
    if args.stack:
        rows = arguments.load(args).select(args.stack, args.local_base)
        # Rows share series (a CUDA axis does not change sglang): check each once, in row order.
        return list(dict.fromkeys(pair for row in rows for pair in row.patch_series))
    if args.package:
        return [(args.package, args.version)]
    selected = patch_series.all_series(patches_root)
    if not selected:
        raise UserError(f"no patch series under {patches_root}")
    return selected


def run_check(args: argparse.Namespace) -> int:
    patches_root = Project.of_matrix(args.matrix).patches
    selected = _selected(args, patches_root)
    if not selected:
        print(f"stack {', '.join(args.stack)} patches nothing")
    failed = False
    for distribution, version in selected:
        check = patch_series.check_series(distribution, version, root=patches_root)
        print("\n".join(patch_series.format_check(check)), flush=True)
        failed |= not check.ok
    return 1 if failed else 0


def run_refresh(args: argparse.Namespace) -> int:
    patches_root = Project.of_matrix(args.matrix).patches
    outcomes = patch_series.refresh_series(args.package, args.from_version, args.to_version, root=patches_root)
    target = patch_series.series_dir(args.package, args.to_version, patches_root)
    for outcome in outcomes:
        print(f"  {'refreshed' if outcome.ok else 'NEEDS A PERSON'} {outcome.name}")
        for line in outcome.detail:
            print(f"    {line}")
    left = [o.name for o in outcomes if not o.ok]
    print(f"wrote {target}" + (f"; still to do by hand: {', '.join(left)}" if left else ""))
    return 1 if left else 0
