"""`builder fetch`: every locked wheel and .deb of the selected stacks into the host's cache."""

from builder.build_stack import build
from builder.cache import deb_cache, wheel_cache
from builder.cli import arguments
from builder.engine.progress import Progress
from builder.lock import debian_archive
from builder.lock.resolution import check_current


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fetch", help="download the locked wheels and .debs into the cache (once per sha256), e.g. to carry "
                      "to an air-gapped host for `builder build --offline`")
    arguments.add_matrix_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    matrix = arguments.load(args)
    cache = wheel_cache.WheelCache()
    debs = deb_cache.DebCache()
    progress = Progress.for_environment()
    for stack in matrix.select(args.stack, args.local_base):
        resolution = check_current(stack, matrix.project.lock).resolution
        fetched = build.fetch_wheels(stack, resolution, cache, offline=False, progress=progress)
        print(f"{stack.name}: {fetched.wanted} locked wheels in {cache.root} "
              f"({fetched.downloaded} downloaded, {fetched.downloaded_bytes} bytes)")
        locked = resolution.system_packages  # the local base's too: `builder base` needs them
        if locked is not None:
            got = debs.fill(locked, stack.name, lambda: debian_archive.fetch_sources(stack.base.apt))
            print(f"{stack.name}: {got.wanted} locked .debs in {debs.root} ({got.downloaded} downloaded, "
                  f"{got.downloaded_bytes} bytes, {got.from_snapshot} from the snapshot archive)")
    return 0
