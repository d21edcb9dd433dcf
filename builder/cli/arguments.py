"""Arguments several commands share."""

from __future__ import annotations

import argparse

from builder.config.matrix import Matrix, load_matrix
from builder.engine import ENGINE_NAMES, default_engine_name


def add_matrix_arguments(parser: argparse.ArgumentParser, stacks: bool = True) -> None:
    parser.add_argument("--matrix", default="matrix.toml", help="version matrix (default: %(default)s)")
    parser.add_argument("--local-base", action="store_true",
                        help="use the base `builder base` makes locally instead of each stack's registry base")
    if stacks:
        parser.add_argument("--stack", action="append", metavar="S", help="only this stack row (repeatable)")


def load(args: argparse.Namespace) -> Matrix:
    return load_matrix(args.matrix, local_base=args.local_base)


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default=default_engine_name(), choices=ENGINE_NAMES,
                        help="container engine (default: %(default)s; BUILDER_ENGINE sets it)")
