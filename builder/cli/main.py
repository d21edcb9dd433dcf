"""`builder` command line: argument parsing only; each command lives in builder.cli.commands."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from builder.cli import commands
from builder.errors import BuildFailure, UserError


class Parser(argparse.ArgumentParser):
    """A bad argument is one line and exit 2, like every other input error (not argparse's usage block)."""

    def error(self, message: str):
        raise UserError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="builder",
        description="Reproducible container images for SGLang GPU serving stacks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (UserError, BuildFailure) as error:
        for line in str(error).splitlines():
            print(f"builder: error: {line}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("builder: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
