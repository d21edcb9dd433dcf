"""`builder base`: make the local Debian base image, load it into the engine, print its image id."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from builder.base.local_base import DEFAULT_PACKAGES, BaseSpec, check_locked, make_base
from builder.cache.deb_cache import DebCache
from builder.cli import arguments
from builder.config.matrix import Matrix, load_matrix
from builder.engine import get_engine
from builder.errors import UserError
from builder.lock import store
from builder.lock import debian_archive
from builder.lock.resolution import record_base
from builder.lock.system_packages import SystemPackages
from builder.paths import LOCAL_BASE_REPOSITORY, local_base_tag

DEFAULT_MATRIX = "matrix.toml"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "base",
        help="build the local Debian base image with mmdebstrap (reproducible)",
        description="Build a minimal Debian base image with mmdebstrap from exactly the .deb files "
        "matrix.lock records (fetched into the cache when missing), with no network, bit-for-bit "
        "reproducible for a given SOURCE_DATE_EPOCH; load it into the engine and print its image id.",
    )
    parser.add_argument(
        "--matrix", default=DEFAULT_MATRIX,
        help="version matrix whose [local_base] and source_date_epoch give the defaults "
        "(default: %(default)s; without it: bookworm, $SOURCE_DATE_EPOCH)",
    )
    parser.add_argument("--suite", default=None, help="Debian suite (default: the matrix's, else bookworm)")
    parser.add_argument(
        "--output", type=Path, default=Path("build/base"),
        help="directory for the image archive, package list and record (default: %(default)s)",
    )
    parser.add_argument(
        "--source-date-epoch", type=int, default=None,
        help="timestamp for every file and the image config "
        "(default: the matrix's source_date_epoch, else $SOURCE_DATE_EPOCH)",
    )
    parser.add_argument(
        "--tag", default="",
        help=f"image tag (default: {LOCAL_BASE_REPOSITORY}:NAME from the matrix, else :SUITE)",
    )
    arguments.add_engine_argument(parser)
    parser.add_argument(
        "--no-load", action="store_true", help="only write the archive; load it into no engine"
    )
    parser.add_argument(
        "--check-reproducible", action="store_true",
        help="run mmdebstrap twice and fail unless both tarballs are identical",
    )
    parser.set_defaults(func=run)


def _source_date_epoch(value: int | None) -> int:
    if value is not None:
        return value
    from_env = os.environ.get("SOURCE_DATE_EPOCH")
    if from_env is None:
        raise UserError(
            "no SOURCE_DATE_EPOCH: pass --source-date-epoch or set SOURCE_DATE_EPOCH "
            "(the wall clock is never used, so the base is reproducible)"
        )
    try:
        return int(from_env)
    except ValueError:
        raise UserError(f"SOURCE_DATE_EPOCH must be an integer, got {from_env!r}") from None


def spec_from_args(args: argparse.Namespace) -> tuple[BaseSpec, Matrix | None]:
    """The base to make, and the matrix naming it (None without one): flags override the matrix,
    the matrix overrides $SOURCE_DATE_EPOCH."""
    matrix_path = Path(args.matrix)
    if matrix_path.is_file() or args.matrix != DEFAULT_MATRIX:
        matrix = load_matrix(matrix_path)
        local = matrix.local_base
        name = local["name"]
        epoch = args.source_date_epoch if args.source_date_epoch is not None else matrix.source_date_epoch
        spec = BaseSpec(
            source_date_epoch=_checked(epoch),
            suite=args.suite or local.get("suite", "bookworm"),
            packages=tuple(local.get("packages", ())) or DEFAULT_PACKAGES,
            tag=args.tag or local_base_tag(name),
        )
        return spec, matrix
    epoch = _checked(_source_date_epoch(args.source_date_epoch))
    return BaseSpec(source_date_epoch=epoch, suite=args.suite or "bookworm", tag=args.tag), None


def _checked(epoch: int) -> int:
    if epoch < 0:
        raise UserError(f"SOURCE_DATE_EPOCH must not be negative, got {epoch}")
    return epoch


def locked_packages(matrix: Matrix) -> SystemPackages | None:
    """The base's packages as `builder lock` recorded them (every row on the local base shares them)."""
    lock = store.read(matrix.project.lock)
    for stack in matrix.all_rows():
        found = lock.get(stack.name) if stack.base.local else None
        if found is not None and found.resolution.system_packages is not None:
            return found.resolution.system_packages
    return None


def run(args: argparse.Namespace) -> int:
    spec, matrix = spec_from_args(args)
    if matrix is None:
        raise UserError("builder base builds from the .debs matrix.lock records: run it beside matrix.toml, or "
                        "name one with --matrix")
    engine = None if args.no_load else get_engine(args.engine)
    make_and_record(spec, matrix, args.output, engine, args.check_reproducible)
    return 0


def local_base_sources(matrix: Matrix) -> Callable[[], tuple[str, ...]]:
    """Where the local base's .debs are fetched from first: the apt sources of the local rows (apt's own
    configuration, which names the mirror), before each archive's snapshot."""
    apt = next((stack.base.apt for stack in matrix.all_rows() if stack.base.local and stack.base.apt), None)
    return lambda: debian_archive.fetch_sources(apt) if apt else ()


def make_and_record(spec: BaseSpec, matrix: Matrix, output: Path, engine, check_reproducible: bool = False) -> str:
    """Make the base from the lock's .debs, load it, record its digest for the rows on it; returns it."""
    locked = check_locked(spec, locked_packages(matrix))
    if engine is not None:
        engine.check()
    result = make_base(spec, output, locked, DebCache(), engine=engine, check_reproducible=check_reproducible,
                       sources=local_base_sources(matrix))
    print(f"base {result.tag}: {result.image_id}")
    print(f"  archive {result.archive} (layer {result.rootfs_sha256}, {result.rootfs_bytes} bytes)")
    if engine is not None:
        stacks = record_base(matrix.local_base["name"], result.image_id, matrix.project.lock)
        if stacks:
            print(f"  recorded in the lock for: {', '.join(stacks)}")
    return result.image_id
