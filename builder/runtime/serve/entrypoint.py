"""The image's entrypoint: `serve`, `bench`, `smoke` and `shell`.

    docker run --gpus all --ipc=host -v /models:/models -v /cache:/cache -p 30000:30000 \\
        IMAGE serve --mode baseline --model /models/M

Import scheme: runtime modules import each other absolutely, as
`builder.runtime.<module>`, and nothing else outside the standard library. The
image copies this folder to /opt/builder/runtime, beside stack.json and with no
/opt/builder/__init__.py, so with /opt on the import path `builder` is a
namespace package and `builder.runtime` resolves there exactly as it does in
the repository:

    COPY builder/runtime/ /opt/builder/runtime/
    ENV PYTHONPATH=/opt
    ENTRYPOINT ["/opt/venv/bin/python", "-m", "builder.runtime.serve.entrypoint"]

The server, the benchmark and the smoke checks run under this same interpreter
(sys.executable), so the ENTRYPOINT names the stack's virtual environment.
Exit statuses are listed in serve/errors.py and docs/entrypoint.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import urllib.parse
from pathlib import Path

from builder.runtime import flashinfer_bake, stackinfo
from builder.runtime.serve import api_key, bench, health, launch, preflight
from builder.runtime.serve.errors import (
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    EntrypointError,
    PreflightError,
    StartupFailed,
    Unhealthy,
    StartupStalled,
    UsageError,
)
from builder.runtime.serve.supervise import Supervisor, Timeouts, health_url, server_url

PROG = "entrypoint"
# The smoke program runs as the module builder.runtime.smoke, from the directory holding builder/
# (/opt in the image): serve/entrypoint.py -> serve -> runtime -> builder -> that directory.
TOOLS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMOKE_PROGRAM = os.path.join(TOOLS_ROOT, "builder", "runtime", "smoke", "__main__.py")
DEFAULT_TOLERANCE = 0.03
DEFAULT_WARMUP = 2


def say(message: str) -> None:
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


# ---- command line ------------------------------------------------------------------------


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return seconds(value)
    except (ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"{name}={value!r} is not a positive number of seconds") from None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def tokens_per_second(text: str) -> float:
    """A decode rate in tok/s: positive and finite."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive rate in tok/s")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port")
    return value


def server_base_url(text: str) -> str:
    """http(s)://HOST[:PORT][/PATH] of a running server."""
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a server URL; give http://HOST:PORT")
    if port == 0:
        raise argparse.ArgumentTypeError(f"{text!r} names port 0")
    return text


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line, exit 2, like every other usage error (not argparse's usage block)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def add_launch_options(parser: argparse.ArgumentParser, model_required: bool) -> None:
    parser.add_argument("--mode", required=True, help="serve profile from stack.json (baseline, eagle3)")
    parser.add_argument("--model", required=model_required, help="model checkpoint directory")
    parser.add_argument("--draft-model", help="draft checkpoint for speculative modes (eagle3)")
    parser.add_argument("--tp", type=positive_int, help="tensor parallel size (profile default: 8)")
    parser.add_argument("--port", type=port_number, help="HTTP port (profile default)")
    parser.add_argument("--host", help="listen address (profile default)")
    parser.add_argument("--api-key-file", help="file holding the API key the server requires (or set "
                        "SERVE_API_KEY_FILE or SERVE_API_KEY; health checks bypass it)")
    parser.add_argument("--api-key", help=argparse.SUPPRESS)  # refused: see api_key.py
    parser.add_argument("--nnodes", type=positive_int, help="number of nodes (multi-node)")
    parser.add_argument("--node-rank", type=non_negative_int, help="this node's rank (multi-node)")
    parser.add_argument("--dist-init-addr", help="HOST:PORT of node 0 (multi-node)")
    parser.add_argument("--cache-dir", help="JIT cache directory (stack default: /cache)")
    parser.add_argument("--log-file", help="server log (default: CACHE_DIR/logs/sglang-portP-nodeR.log)")
    parser.add_argument(
        "--stall-timeout", type=seconds, help="seconds without progress before giving up (default 300)"
    )
    parser.add_argument("--start-timeout", type=seconds, help="total cap on starting (default 3600)")
    parser.add_argument(
        "--stop-timeout", type=seconds, help="seconds between forwarding a stop signal and SIGKILL (default 30)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Launch, supervise and benchmark the stack's SGLang server.",
        epilog="Arguments after -- go to sglang.launch_server unchanged.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="start the server and supervise it until it ends")
    add_launch_options(serve, model_required=True)
    serve.add_argument(
        "--dry-run", action="store_true", help="print the launch command and environment as JSON; start nothing"
    )
    serve.set_defaults(func=cmd_serve)

    bench_parser = commands.add_parser("bench", help="start (or attach to) the server and benchmark it")
    add_launch_options(bench_parser, model_required=False)
    bench_parser.add_argument("--url", type=server_base_url,
                              help="benchmark a running server (http://HOST:PORT) instead of launching one")
    bench_parser.add_argument("--input-len", type=positive_int, help="prompt tokens (stack default)")
    bench_parser.add_argument("--output-len", type=positive_int, help="generated tokens (stack default)")
    bench_parser.add_argument("--repetitions", type=positive_int, help="measured requests (stack default)")
    bench_parser.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP)
    bench_parser.add_argument("--reference", type=tokens_per_second,
                              help="tok/s to compare with (default: the mode's pinned figure, else the replaced stack's)")
    bench_parser.add_argument("--tolerance", type=float, help="allowed loss, 0.03 = 3%% (stack default)")
    bench_parser.add_argument("--output", help="report path (default: CACHE_DIR/bench/STACK-MODE.json)")
    bench_parser.set_defaults(func=cmd_bench)

    health_parser = commands.add_parser("health", help="exit 0 when the server's /health answers 200 (health checks)")
    health_parser.add_argument("--port", type=port_number, default=health.DEFAULT_PORT,
                               help=f"the server's port (default {health.DEFAULT_PORT})")
    health_parser.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    health_parser.add_argument("--timeout", type=seconds, default=health.DEFAULT_TIMEOUT_S,
                               help=f"seconds to wait for the answer (default {health.DEFAULT_TIMEOUT_S:g})")
    health_parser.set_defaults(func=cmd_health)

    commands.add_parser("smoke", help="run the image's smoke checks (arguments pass through)", add_help=False)
    commands.add_parser("shell", help="exec bash (arguments pass through)", add_help=False)
    return parser


def split_passthrough(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], tuple(argv[index + 1 :])
    return argv, ()


# ---- shared steps --------------------------------------------------------------------------


def load_stack() -> dict:
    try:
        return stackinfo.load()
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the stack description: {error}") from None


def server_key(args: argparse.Namespace) -> api_key.ApiKey | None:
    if args.api_key is not None:
        raise UsageError("--api-key is not taken: a command line is visible to every process listing; "
                         f"use --api-key-file PATH or set {api_key.FILE_VARIABLE} or {api_key.KEY_VARIABLE}")
    return api_key.read(args.api_key_file, os.environ)


def serve_options(args: argparse.Namespace, extra: tuple[str, ...]) -> launch.ServeOptions:
    return launch.ServeOptions(
        mode=args.mode,
        model=args.model,
        draft_model=args.draft_model,
        tp=args.tp,
        port=args.port,
        host=args.host,
        api_key=server_key(args),
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        dist_init_addr=args.dist_init_addr,
        cache_dir=args.cache_dir,
        extra_args=extra,
    )


def timeouts(args: argparse.Namespace) -> Timeouts:
    def pick(flag, variable, default):
        return flag if flag is not None else env_float(variable, default)

    base = Timeouts()
    return Timeouts(
        stall_s=pick(args.stall_timeout, "ENTRYPOINT_STALL_TIMEOUT", base.stall_s),
        start_s=pick(args.start_timeout, "ENTRYPOINT_START_TIMEOUT", base.start_s),
        stop_s=pick(args.stop_timeout, "ENTRYPOINT_STOP_TIMEOUT", base.stop_s),
    )


def announce_env(plan: launch.LaunchPlan) -> None:
    for name in sorted(plan.env):
        if name in os.environ and os.environ[name] != plan.env[name]:
            say(f"env {name}={os.environ[name]} (set by the caller; profile says {plan.env[name]})")
        else:
            say(f"env {name}={plan.env[name]}")


def run_preflight(plan: launch.LaunchPlan, stack: dict) -> preflight.PreflightReport:
    report = preflight.run_preflight(plan, dict(os.environ), stack["driver"])
    for warning in report.warnings:
        say(f"warning: {warning}")
    if report.problems:
        raise PreflightError("\n".join(report.problems))
    say(f"pre-flight passed: {len(report.gpu_names)} GPU(s), {plan.gpus_needed} needed")
    seeded = flashinfer_bake.seed_cache(Path(plan.env["FLASHINFER_WORKSPACE_BASE"]))
    if seeded:
        say(f"FlashInfer cache seeded with the modules baked at build time: {', '.join(seeded)}")
    return report


def supervised(plan: launch.LaunchPlan, args, report, limits: Timeouts, job_factory=None) -> int:
    """Run the server under a Supervisor; `job_factory(supervisor)` gives the after-ready job."""
    log_path = args.log_file or os.path.join(
        plan.cache_dir, "logs", f"sglang-port{plan.port}-node{plan.node_rank}.log"
    )
    supervisor = Supervisor(
        command=list(plan.command),
        env=launch.child_environment(plan, dict(os.environ)),
        log_path=log_path,
        health=health_url(plan.host, plan.port),
        timeouts=limits,
        redact=plan.key.redact if plan.key else None,
    )
    job = job_factory(supervisor) if job_factory else None
    try:
        return supervisor.run(job=job, display=list(plan.command))
    except (StartupFailed, StartupStalled):
        if report.busy:  # the likeliest reason a start fails on this deployment
            say("note: GPU memory was held by " + ", ".join(p.describe() for p in report.busy))
        raise


# ---- commands ------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    stack = load_stack()
    plan = launch.build_plan(stack, serve_options(args, extra), sys.executable)
    if args.dry_run:
        print(json.dumps({"command": list(plan.command), "env": plan.env}, indent=2, sort_keys=True))
        return EXIT_OK
    limits = timeouts(args)
    announce_env(plan)
    report = run_preflight(plan, stack)
    return supervised(plan, args, report, limits)


def bench_plan(args: argparse.Namespace, stack: dict) -> bench.BenchPlan:
    """The stack's bench settings and reference figure, overridden by the options given."""
    launch.mode_profile(stack, args.mode)  # an unknown mode is a usage error
    settings = stack["bench"]
    workload = bench.Workload(
        input_len=args.input_len or settings["input_len"],
        output_len=args.output_len or settings["output_len"],
        warmup=args.warmup,
        repetitions=args.repetitions or settings["num_prompts"],
    )
    if workload.output_len < 2:
        raise UsageError("--output-len must be at least 2 to measure a decode rate")
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = settings.get("regression_tolerance", DEFAULT_TOLERANCE)
    if not 0 <= tolerance < 1:
        raise UsageError(f"--tolerance {tolerance} is not a fraction between 0 and 1")
    cache_dir = args.cache_dir or stack["serve"].get("cache_dir") or "/cache"
    # A launched server gets the caller's environment; an attached one (--url) is taken as its mode's.
    effective = bench.communication(stack, args.mode, None if args.url else dict(os.environ))
    return bench.BenchPlan(
        stack=stack,
        mode=args.mode,
        workload=workload,
        reference=bench.comparable(bench.choose_reference(stack, args.mode, args.reference),
                                   bench.communication(stack, args.mode), effective),
        communication=effective,
        tolerance=tolerance,
        output=args.output or os.path.join(cache_dir, "bench", f"{stack['stack']}-{args.mode}.json"),
    )


def cmd_bench(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    stack = load_stack()
    measure = bench_plan(args, stack)
    if args.url:
        if args.model or args.draft_model or extra:
            raise UsageError("--url benchmarks a running server: drop --model, --draft-model and -- arguments")
        # No Supervisor here to catch stop signals, and PID 1 ignores those it has no handler for.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(EXIT_SIGNAL_BASE + signum))
        key = server_key(args)
        return bench.benchmark(measure, args.url, key.value if key else None, say)
    if not args.model:
        raise UsageError("bench needs --model PATH to launch a server, or --url URL to attach to one")

    plan = launch.build_plan(stack, serve_options(args, extra), sys.executable)
    limits = timeouts(args)
    announce_env(plan)
    report = run_preflight(plan, stack)
    url = server_url(plan.host, plan.port)

    def job_for(supervisor: Supervisor):
        return lambda: bench.benchmark(
            measure, url, plan.api_key, say, report.gpu_names, supervisor.gen_throughputs
        )

    return supervised(plan, args, report, limits, job_for)


def cmd_health(args: argparse.Namespace, extra: tuple[str, ...]) -> int:
    if extra:
        raise UsageError("health takes no arguments after --")
    url = health_url(args.host, args.port)
    problem = health.probe(url, args.timeout)
    if problem:
        raise Unhealthy(problem)
    print(f"healthy: GET {url} answered 200")
    return EXIT_OK


def exec_smoke(arguments: list[str]) -> int:
    if not os.path.isfile(SMOKE_PROGRAM):
        raise EntrypointError(f"smoke checks are not installed: {SMOKE_PROGRAM} is missing")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [TOOLS_ROOT, environment.get("PYTHONPATH")]))
    os.execve(sys.executable, [sys.executable, "-m", "builder.runtime.smoke", *arguments], environment)
    return EXIT_OK  # not reached: exec replaced this process


def exec_shell(arguments: list[str]) -> int:
    try:
        os.execvp("bash", ["bash", *arguments])
    except OSError as error:
        raise EntrypointError(f"cannot start bash: {error.strerror}") from None
    return EXIT_OK  # not reached


# ---- main ----------------------------------------------------------------------------------


def report_error(error: EntrypointError) -> None:
    for line in str(error).splitlines():
        say(f"error: {line}")
    if error.log_tail:
        sys.stderr.write(f"---- last {len(error.log_tail)} lines of the server log ({error.log_path}) ----\n")
        for line in error.log_tail:
            sys.stderr.write(line + "\n")
        sys.stderr.write("---- end of server log ----\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["smoke"]:
            return exec_smoke(argv[1:])
        if argv[:1] == ["shell"]:
            return exec_shell(argv[1:])
        own, extra = split_passthrough(argv)
        parser = build_parser()
        args = parser.parse_args(own)
        return args.func(args, extra)
    except EntrypointError as error:
        report_error(error)
        return error.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        return EXIT_SIGNAL_BASE + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
