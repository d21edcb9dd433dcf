"""`builder base`: make the local Debian base image, load it into the engine, print its digest."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from builder.base import BaseSpec, make_base
from builder.engine import ENGINE_NAMES, get_engine
from builder.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "base",
        help="build the local Debian base image with mmdebstrap (reproducible)",
        description="Build a minimal Debian base image with mmdebstrap, bit-for-bit reproducible "
        "for a given SOURCE_DATE_EPOCH, load it into the engine and print its digest.",
    )
    parser.add_argument("--suite", default="bookworm", help="Debian suite (default: %(default)s)")
    parser.add_argument(
        "--output", type=Path, default=Path("build/base"),
        help="directory for the image archive, package list and record (default: %(default)s)",
    )
    parser.add_argument(
        "--source-date-epoch", type=int, default=None,
        help="timestamp for every file and the image config (default: $SOURCE_DATE_EPOCH)",
    )
    parser.add_argument("--tag", default="", help="image tag (default: localhost/builder-base:SUITE)")
    parser.add_argument(
        "--mirror", default=None, help="Debian mirror URI (default: apt's default mirror)"
    )
    parser.add_argument("--engine", choices=ENGINE_NAMES, default="buildah")
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


def run(args: argparse.Namespace) -> int:
    epoch = _source_date_epoch(args.source_date_epoch)
    if epoch < 0:
        raise UserError(f"SOURCE_DATE_EPOCH must not be negative, got {epoch}")
    spec = BaseSpec(source_date_epoch=epoch, suite=args.suite, mirror=args.mirror, tag=args.tag)
    engine = None if args.no_load else get_engine(args.engine)
    if engine is not None:
        engine.check()
    result = make_base(spec, args.output, engine=engine, check_reproducible=args.check_reproducible)
    print(f"base {result.tag}: {result.image_id}")
    print(f"  archive {result.archive} (layer {result.rootfs_sha256}, {result.rootfs_bytes} bytes)")
    return 0
