"""entrypoint: each serve mode's launch flags are accepted by SGLang's own parser.

In a child interpreter: argparse.ArgumentParser(), ServerArgs.add_cli_args,
parse_args(flags), then every setting the stack asked for must come back with
the value asked for (a flag consumed as another option's value is caught
too). No GPU needed: ServerArgs' post-init, which probes the device, is not run.
"""

from __future__ import annotations

import json
import textwrap

from builder.runtime.smoke import report
from builder.runtime import stackinfo
from builder.runtime.smoke.env import Environment, run_python, side_by_side

# Placeholders: parsing checks paths for nothing, and the check must not
# depend on a model being mounted.
MODEL_PATH = "/models/smoke-check-model"
DRAFT_MODEL_PATH = "/models/smoke-check-draft"

# Prints, for each flag the stack set, the value argparse stored for it (read
# through the flag's own action: `--tp-size` lands in `tensor_parallel_size`).
_PARSE = textwrap.dedent("""
    import argparse, json, sys
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags, asked = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    namespace = parser.parse_args(flags)
    dests = {option: action.dest for action in parser._actions for option in action.option_strings}
    print(json.dumps({flag: getattr(namespace, dests[flag], None) if flag in dests else "<no such flag>"
                      for flag in asked}, default=str))
""")


def launch_settings(info: dict, mode: str) -> dict:
    """ServerArgs-named settings the entrypoint launches `mode` with."""
    profile = info["serve"]["modes"][mode]
    settings = {"model_path": MODEL_PATH, **profile["args"]}
    if profile.get("requires_draft_model"):
        settings.setdefault("speculative_draft_model_path", DRAFT_MODEL_PATH)
    return settings


def run(env: Environment) -> list[report.Result]:
    modes = sorted(env.info["serve"]["modes"])
    if not modes:
        return [report.skipped("entrypoint", "the stack defines no serve modes")]
    if not env.in_stack("sglang"):
        return [report.skipped(f"entrypoint.{mode}", "sglang is not part of this stack")
                for mode in modes]
    return side_by_side(lambda mode: check_mode(env, mode), modes)  # a child interpreter per mode


def check_mode(env: Environment, mode: str) -> report.Result:
    check = f"entrypoint.{mode}"
    settings = launch_settings(env.info, mode)
    flags = stackinfo.server_arg_flags(settings)
    asked = {stackinfo.server_arg_flags({name: value})[0]: value
             for name, value in settings.items() if value is not False and value is not None}
    child = run_python(["-c", _PARSE, json.dumps(flags), json.dumps(sorted(asked))])
    if not child.ok:
        return report.failed(check, f"SGLang's parser rejects `{' '.join(flags)}`: "
                                    f"{child.reason()}")
    parsed = json.loads(child.stdout.strip().splitlines()[-1])
    wrong = [f"{flag}: asked {value!r}, parsed {parsed[flag]!r}"
             for flag, value in sorted(asked.items()) if not _same(parsed[flag], value)]
    if wrong:
        return report.failed(check, "parsed differently than asked: " + "; ".join(wrong))
    return report.passed(check, " ".join(flags))


def _same(parsed: object, wanted: object) -> bool:
    if isinstance(wanted, list):
        return isinstance(parsed, list) and [str(item) for item in parsed] == [
            str(item) for item in wanted]
    if isinstance(wanted, bool):
        return parsed is wanted
    return str(parsed) == str(wanted)
