"""`builder fetch`: every locked wheel of the selected stacks into the host's wheel cache."""

from builder.cli import arguments
from builder.engine.progress import Progress
from builder.image import build, wheel_cache
from builder.lock.resolution import check_current


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fetch", help="download the locked wheels into the wheel cache (once per sha256), e.g. to carry "
                      "to an air-gapped host for `builder build --offline`")
    arguments.add_matrix_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    cache = wheel_cache.WheelCache()
    progress = Progress.for_environment()
    for stack in matrix.select(args.stack, args.local_base):
        resolution = check_current(stack, matrix.project.lock).resolution
        fetched = build.fetch_wheels(stack, resolution, cache, offline=False, progress=progress)
        print(f"{stack.name}: {fetched.wanted} locked wheels in {cache.root} "
              f"({fetched.downloaded} downloaded, {fetched.downloaded_bytes} bytes)")
    return 0
