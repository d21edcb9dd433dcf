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


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `argv` naming a command, that command's alone: each command module
    imports what its command runs, and a no-op build should not pay for the other fourteen."""
    parser = Parser(
        prog="builder",
        description="Reproducible container images for SGLang GPU serving stacks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    named = next((arg for arg in argv or () if not arg.startswith("-")), None)
    for name in [named] if named in names else names:
        importlib.import_module(f"{commands.__name__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
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
