"""Smoke checks of a built image, run inside it before it is tagged.

    /opt/venv/bin/python -m builder.runtime.smoke [--json] [--only CHECK ...]   (PYTHONPATH=/opt)

Reads the stack description (/opt/builder/stack.json, or --stack / the
BUILDER_STACK_JSON variable) and runs the named checks: versions, imports,
abi, arch, compile, patches, entrypoint, gpu. Each row passes, fails or is skipped with
a reason. Prints a table (or JSON with --json); exit status 1 when any check
failed, 2 for bad usage or an unreadable stack description, 3 when the NVIDIA
driver is older than the stack's CUDA needs (the gpu.driver row says which).

Standard library only; runs as the module builder.runtime.smoke (its __main__ calls main here).
"""

from __future__ import annotations

import argparse
import sys
import traceback

from builder.runtime import stackinfo
from builder.runtime.smoke import abi, arch, gpu, imports, launch_command, patches, report, toolchain, versions
from builder.runtime.smoke.env import Environment, side_by_side

# In the order they are reported (they run concurrently): cheap facts first, the GPU last.
CHECKS = {
    "versions": versions.run,
    "imports": imports.run,
    "abi": abi.run,
    "arch": arch.run,
    "compile": toolchain.run,
    "patches": patches.run,
    "entrypoint": launch_command.run,
    "gpu": gpu.run,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), metavar="CHECK",
                        help=f"run only these checks ({', '.join(CHECKS)})")
    parser.add_argument("--stack", help="stack description (default: $BUILDER_STACK_JSON or "
                                        f"{stackinfo.DEFAULT_PATH})")
    parser.add_argument("--gpu-expect-offset", type=float, default=0.0, metavar="X",
                        help="add X to every GPU reference result: a non-zero X plants a wrong "
                             "expectation that the gpu checks must report (default 0)")
    return parser


def run_checks(env: Environment, names: list[str]) -> list[report.Result]:
    """The checks side by side; the report keeps the order of `names`, whatever finishes first."""
    return [result for results in side_by_side(lambda name: _run_one(env, name), names) for result in results]


def _run_one(env: Environment, name: str) -> list[report.Result]:
    try:
        return CHECKS[name](env)
    except Exception as error:  # a bug in one check must not hide the others' results
        where = traceback.extract_tb(error.__traceback__)[-1]
        return [report.failed(
            name, f"check crashed: {type(error).__name__}: {error} "
                  f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})")]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        info = stackinfo.load(args.stack)
    except (OSError, ValueError) as error:
        print(f"smoke: error: cannot read the stack description: {error}", file=sys.stderr)
        return 2
    env = Environment(info, gpu_expect_offset=args.gpu_expect_offset)
    names = [name for name in CHECKS if not args.only or name in args.only]
    results = run_checks(env, names)
    if args.json:
        sys.stdout.write(report.to_json(env.stack, results))
    else:
        sys.stdout.write(report.format_table(env.stack, results))
    if gpu.driver_refused(results):
        return 3
    return 1 if any(result.status == report.FAIL for result in results) else 0
