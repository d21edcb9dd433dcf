"""`builder compat refresh PACKAGE==VERSION ...`: compatibility facts read from the packages' own wheels."""

from __future__ import annotations

from builder.bump import compat_refresh


def register(subparsers) -> None:
    parser = subparsers.add_parser("compat", help="generate compatibility facts from the packages themselves")
    actions = parser.add_subparsers(dest="compat_action", required=True, metavar="ACTION")
    refresh = actions.add_parser(
        "refresh", help="derive wheel tags, glibc, declared requirements and CUDA builds from the default index")
    refresh.add_argument("pins", nargs="+", metavar="PACKAGE==VERSION")
    refresh.set_defaults(func=run_refresh)


def run_refresh(args) -> int:
    pins = [compat_refresh.parse_pin(text) for text in args.pins]
    for facts in compat_refresh.refresh(pins):
        cuda = f", CUDA {facts.cuda} ({facts.cuda_source})" if facts.cuda else ""
        print(f"{facts.key}: tags {', '.join(facts.wheel_tags)}"
              f"{', glibc ' + facts.glibc if facts.glibc else ''}{cuda}; {len(facts.declared)} declared "
              f"requirements; from {facts.source}")
    print(f"wrote {compat_refresh.generated_facts_path()}")
    return 0
