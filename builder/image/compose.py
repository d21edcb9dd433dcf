"""The values of images/<stack>/compose.yaml: one service per serve profile, the image the lock records.

templates/compose.yaml.j2 lays them out. The file is not a build input (no COPY reads it), so naming
the built image in it cannot change that image.

Which reference names the image:
  - pushed (`builder push` recorded a registry digest): REGISTRY/REPOSITORY@sha256:<manifest digest>,
    what `builder pull` fetches and checks; a GPU host pulls exactly that image.
  - built here, not pushed: the immutable tag. An image id is no reference a registry or a pull
    resolves, and a locally built image has no repository digest, so the tag (one image per inputs
    hash, never moved by `builder build`) stands in, with the id in the header to compare.
  - not built: the moving tag, until `builder build` and `builder render` name the immutable one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from builder.config.stack import ServeMode, Stack
from builder.image import tags
from builder.runtime.serve import health
from builder.runtime.serve.supervise import Timeouts

MODELS_DIR = "/models"
PYTHON = "/opt/venv/bin/python"
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
    return "${" + name + ":-" + default + "}"


def quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is a subset of it)."""
    return json.dumps(text)


def image_reference(stack: Stack, entry: dict | None) -> ComposeImage:
    image = (entry or {}).get("image")
    push = (entry or {}).get("push")
    if image and push and push.get("digest") == image.get("digest"):
        return ComposeImage(push["reference"], (
            "the registry digest `builder push` recorded in matrix.lock; `builder pull` fetches the same",
            f"image and checks its id ({image['id']}).",
        ))
    if image:
        return ComposeImage(image["immutable_tag"], (
            "the immutable tag of the image matrix.lock records, built here and not pushed: a local image",
            f"has no registry digest, and its id ({image['id']})",
            "is no reference to pull. After `builder push` and `builder render` it is named by digest.",
        ))
    return ComposeImage(tags.moving_tag(stack), (
        "the moving tag: matrix.lock records no image of this stack yet. After `builder build` and",
        "`builder render` the image is named by its immutable tag, after `builder push` by digest.",
    ))


def mode_port(mode: ServeMode) -> int:
    return int(mode.args.get("port", health.DEFAULT_PORT))


def service(stack: Stack, mode: ServeMode) -> Service:
    command = ["serve", "--mode", mode.name, "--model", variable("SERVE_MODEL", f"{MODELS_DIR}/model")]
    if mode.requires_draft_model:
        command += ["--draft-model", variable("SERVE_DRAFT_MODEL", f"{MODELS_DIR}/draft")]
    environment = {name: literal(str(value)) for name, value in {**stack.serve.env, **mode.env}.items()}
    environment["ENTRYPOINT_STOP_TIMEOUT"] = str(STOP_TIMEOUT_S)
    return Service(mode.name, tuple(command), dict(sorted(environment.items())), mode_port(mode))


def healthcheck(port: int) -> tuple[str, ...]:
    return ("CMD", PYTHON, "-m", ENTRYPOINT_MODULE, "health", "--port", str(port),
            "--timeout", f"{health.DEFAULT_TIMEOUT_S:g}")


def template_values(stack: Stack, entry: dict | None) -> dict:
    services = [service(stack, mode) for mode in stack.serve.modes]
    timeouts = Timeouts()
    return {
        "stack": stack,
        "image": image_reference(stack, entry),
        "services": services,
        "healthchecks": {s.name: healthcheck(s.port) for s in services},
        "cache_dir": literal(stack.serve.cache_dir),
        "models_dir": MODELS_DIR,
        "ulimits": ULIMITS,
        "stop_grace_s": STOP_TIMEOUT_S + STOP_MARGIN_S,
        "health_interval_s": HEALTH_INTERVAL_S,
        # Docker abandons a check at its timeout with no word of why; the command gives up first and says.
        "health_timeout_s": int(2 * health.DEFAULT_TIMEOUT_S),
        "health_retries": HEALTH_RETRIES,
        "start_period_s": int(timeouts.start_s),
        "variable": variable,
        "python": PYTHON,
        "entrypoint_module": ENTRYPOINT_MODULE,
    }
