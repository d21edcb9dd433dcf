"""The values of images/<stack>/compose.yaml: one service per serve profile.

templates/compose.yaml.j2 lays them out. The file is not a build input (no COPY reads it), and it
names nothing a build or push decides: the image is the stack's moving tag, which `builder build`
points at the image it records in matrix.lock and `builder pull` at the image it fetched by the
locked manifest digest (after checking its id). So the committed file stays current through every
build and push, and `SGLANG_IMAGE` runs any other reference instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from builder.config import tags
from builder.config.stack import ServeMode, Stack
from builder.errors import UserError, one_line
from builder.paths import VENV_PYTHON
from builder.runtime.serve import health
from builder.runtime.serve.supervise import Timeouts

MODELS_DIR = "/models"
ENTRYPOINT_MODULE = "builder.runtime.serve.entrypoint"
# The entrypoint forwards SIGTERM to the server's process group and SIGKILLs it after this long: eight
# TP workers release their GPU memory and NCCL state (the deployment had stale processes holding
# GPUs). Docker's own SIGKILL comes STOP_MARGIN_S later, so the entrypoint always gets to do that.
STOP_TIMEOUT_S = 60
STOP_MARGIN_S = 30
# The health check's cadence. During start_period (the entrypoint's own cap on starting: a first start
# with JIT compilation took ~600 s) failures do not count; a server that stops answering is unhealthy
# after `retries` misses.
HEALTH_INTERVAL_S = 30
HEALTH_RETRIES = 3
# The port is published on the host's loopback unless SERVE_BIND names another address: SGLang answers
# anyone who reaches it, and takes an API key only when one is given.
BIND_ADDRESS = "127.0.0.1"
# Passed from the host's environment when set there (compose's `KEY: ${KEY:-}`); empty means no key.
API_KEY_VARIABLE = "SERVE_API_KEY"
# NVIDIA's settings for its framework containers: NCCL and CUDA pin host memory (memlock), and deep
# native stacks need room.
ULIMITS = {"memlock": -1, "stack": 67108864}


@dataclass(frozen=True)
class ComposeImage:
    reference: str
    notes: tuple[str, ...]  # header comment lines: which reference this is and why


@dataclass(frozen=True)
class Service:
    name: str
    command: tuple[str, ...]
    environment: dict
    port: int


def literal(text: str) -> str:
    """`text` as compose reads it unchanged: `$` starts an interpolation there, `$$` is a dollar."""
    return text.replace("$", "$$")


def variable(name: str, default: str) -> str:
    """`${NAME:-default}`; a default holding '}' would end the interpolation early, and is refused."""
    if "}" in default:
        raise UserError(f"'{one_line(default)}' cannot be a compose variable's default (it holds '}}')")
    return "${" + name + ":-" + default + "}"


def quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is a subset of it)."""
    return json.dumps(text)


IMAGE_VARIABLE = "SGLANG_IMAGE"


def image_reference(stack: Stack) -> ComposeImage:
    moving = tags.moving_tag(stack)
    return ComposeImage(variable(IMAGE_VARIABLE, moving), (
        f"{moving}, the moving tag: `builder build` points it at the image matrix.lock records, and",
        "`builder pull` at the image it fetched by the locked manifest digest, after checking its id.",
        f"Set {IMAGE_VARIABLE} to run another reference (REGISTRY/REPOSITORY@sha256:...).",
    ))


def mode_port(mode: ServeMode) -> int:
    port = mode.args.get("port", health.DEFAULT_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UserError(f"serve mode {one_line(mode.name)}: port {one_line(repr(port))} is not an integer from 1 to 65535")
    return port


def service(stack: Stack, mode: ServeMode) -> Service:
    command = ["serve", "--mode", mode.name, "--model", variable("SERVE_MODEL", f"{MODELS_DIR}/model")]
    if mode.requires_draft_model:
        command += ["--draft-model", variable("SERVE_DRAFT_MODEL", f"{MODELS_DIR}/draft")]
    environment = {name: literal(str(value)) for name, value in {**stack.serve.env, **mode.env}.items()}
    environment["ENTRYPOINT_STOP_TIMEOUT"] = str(STOP_TIMEOUT_S)
    environment[API_KEY_VARIABLE] = variable(API_KEY_VARIABLE, "")
    return Service(mode.name, tuple(command), dict(sorted(environment.items())), mode_port(mode))


def healthcheck(port: int) -> tuple[str, ...]:
    return ("CMD", VENV_PYTHON, "-m", ENTRYPOINT_MODULE, "health", "--port", str(port),
            "--timeout", f"{health.DEFAULT_TIMEOUT_S:g}")


def template_values(stack: Stack) -> dict:
    services = [service(stack, mode) for mode in stack.serve.modes]
    timeouts = Timeouts()
    return {
        "stack": stack,
        "image": image_reference(stack),
        "services": services,
        "healthchecks": {s.name: healthcheck(s.port) for s in services},
        "cache_dir": literal(stack.serve.cache_dir),
        "models_dir": MODELS_DIR,
        "bind_address": BIND_ADDRESS,
        "ulimits": ULIMITS,
        "stop_grace_s": STOP_TIMEOUT_S + STOP_MARGIN_S,
        "health_interval_s": HEALTH_INTERVAL_S,
        # Docker abandons a check at its timeout with no word of why; the command gives up first and says.
        "health_timeout_s": int(2 * health.DEFAULT_TIMEOUT_S),
        "health_retries": HEALTH_RETRIES,
        "start_period_s": int(timeouts.start_s),
        "variable": variable,
        "python": VENV_PYTHON,
        "entrypoint_module": ENTRYPOINT_MODULE,
    }
