"""`builder status`: each stack row at a glance (state, image, smoke, bench against the reference,
patches, newer upstream) as a table, JSON, Markdown, or a static page."""

from __future__ import annotations

from builder.config.matrix import load_matrix
from builder.status import page
from builder.status.model import collect
from builder.status.text import as_json, as_markdown, as_table


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "status", help="each stack row: state, image, smoke, bench against the reference, patches, newer upstream")
    parser.add_argument("--matrix", default="matrix.toml", help="version matrix (default: %(default)s)")
    parser.add_argument("--stack", action="append", metavar="S", help="only this stack row (repeatable)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    view.add_argument("--markdown", action="store_true", help="the table as Markdown (e.g. for $GITHUB_STEP_SUMMARY)")
    view.add_argument("--html", metavar="DIR", help="write DIR/index.html: one static page that reads offline")
    parser.add_argument("--refresh-newer", action="store_true",
                        help="first ask pip's default index for the newest releases (the only network use; "
                             "otherwise the last `builder bump --newer` or refresh is shown)")
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = load_matrix(args.matrix)
    status = collect(matrix, args.stack, refresh_newer=args.refresh_newer)
    if args.html:
        print(f"wrote {page.write(args.html, matrix, status, matrix.project.lock)}")
    elif args.json:
        print(as_json(status), end="")
    elif args.markdown:
        print(as_markdown(status), end="")
    else:
        print(as_table(status), end="")
    return 0
