"""The server's command line and environment, derived from the stack's serve profile.

No flag is decided here: the mode's profile in stack.json (written from
matrix.toml) says which ServerArgs to pass; this module only lays the user's
options over it and turns the result into an argument list. No shell.
"""

from __future__ import annotations

import dataclasses
import os

from builder.runtime import flashinfer_bake, stackinfo
from builder.runtime.serve.api_key import ApiKey
from builder.runtime.serve.errors import UsageError

LAUNCHER_MODULE = "sglang.launch_server"
# With an API key the server starts through this module, which adds --api-key inside its process.
KEYED_LAUNCHER_MODULE = "builder.runtime.serve.keyed_launch"
SGLANG_DEFAULT_HOST = "127.0.0.1"  # ServerArgs.host in sglang 0.5.9
SGLANG_DEFAULT_PORT = 30000  # ServerArgs.port

# First-start JIT output, kept under one mounted directory so it is paid once per host.
CACHE_VARIABLES = (
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    ("TRITON_CACHE_DIR", "triton"),
    ("CUDA_CACHE_PATH", "cuda-compute"),  # the driver's PTX JIT cache
)
# A cuDNN/Conv3d guard irrelevant to language models that stops 0.5.9 from starting.
FIXED_ENV = {"SGLANG_DISABLE_CUDNN_CHECK": "1"}

# Flags the entrypoint sets from its own options: supervision (port, host, GPU
# count) must see the same values the server gets, so they may not come in
# through the pass-through arguments.
OWNED_FLAGS = {
    "--model-path": "--model",
    "--model": "--model",
    "--tp-size": "--tp",
    "--tensor-parallel-size": "--tp",
    "--tp": "--tp",
    "--host": "--host",
    "--port": "--port",
    "--api-key": "--api-key-file",
    "--speculative-draft-model-path": "--draft-model",
    "--speculative-draft-model": "--draft-model",
    "--nnodes": "--nnodes",
    "--node-rank": "--node-rank",
    "--dist-init-addr": "--dist-init-addr",
    "--nccl-init-addr": "--dist-init-addr",
}


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """What the user asked for on the entrypoint's command line."""

    mode: str
    model: str
    draft_model: str | None = None
    tp: int | None = None
    port: int | None = None
    host: str | None = None
    api_key: ApiKey | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    dist_init_addr: str | None = None
    cache_dir: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the server, decided before anything runs."""

    mode: str
    model: str
    draft_model: str | None
    command: tuple[str, ...]
    server_args: dict  # ServerArgs name -> value, profile overlaid with the user's options
    env: dict  # variables the entrypoint contributes; the caller's environment wins over them
    cache_dir: str
    key: ApiKey | None = None  # never in `command` or `env`: the launcher reads it (api_key.py)

    @property
    def host(self) -> str:
        return str(self.server_args.get("host") or SGLANG_DEFAULT_HOST)

    @property
    def port(self) -> int:
        return int(self.server_args.get("port") or SGLANG_DEFAULT_PORT)

    @property
    def api_key(self) -> str | None:
        return self.key.value if self.key else None

    @property
    def node_rank(self) -> int:
        return int(self.server_args.get("node_rank") or 0)

    @property
    def gpus_needed(self) -> int:
        """GPUs this node must see: the model-parallel world split over the nodes."""
        world = int(self.server_args.get("tp_size") or 1) * int(self.server_args.get("pp_size") or 1)
        nnodes = int(self.server_args.get("nnodes") or 1)
        return -(-world // nnodes)


def mode_profile(stack: dict, mode: str) -> dict:
    modes = stack["serve"]["modes"]
    if mode not in modes:
        raise UsageError(f"unknown mode {mode!r}; this stack has: {', '.join(sorted(modes))}")
    return modes[mode]


def check_extra_args(extra_args: tuple[str, ...]) -> None:
    for word in extra_args:
        flag = word.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise UsageError(
                f"{flag} is set by the entrypoint; use its {OWNED_FLAGS[flag]} option "
                "instead of passing it after --"
            )


def check_multi_node(options: ServeOptions) -> None:
    """--node-rank below --nnodes; --dist-init-addr as HOST:PORT ([V6]:PORT), as SGLang splits it."""
    if options.node_rank is not None and options.nnodes is not None and options.node_rank >= options.nnodes:
        raise UsageError(f"--node-rank {options.node_rank} must be below --nnodes {options.nnodes} (ranks count from 0)")
    if options.dist_init_addr is not None:
        host, _, port = options.dist_init_addr.rpartition(":")
        if not host.strip("[]") or not (port.isdigit() and 1 <= int(port) <= 65535):
            raise UsageError(f"--dist-init-addr {options.dist_init_addr!r} must be HOST:PORT (node 0's address and a free port)")


def check_model_path(path: str, flag: str) -> None:
    """A checkpoint is a directory; the one file SGLang loads as a model is a GGUF file
    (sglang's check_gguf_file: a .gguf name or the GGUF magic). Absent paths are pre-flight's to report."""
    if not os.path.isfile(path) or path.endswith(".gguf"):
        return
    try:
        with open(path, "rb") as handle:
            if handle.read(4) == b"GGUF":
                return
    except OSError:
        return  # unreadable: pre-flight says so
    raise UsageError(f"{flag} {path} is a file; give the checkpoint directory (config.json and the weights)")


def user_overrides(options: ServeOptions) -> dict:
    """The entrypoint's options as ServerArgs names; unset options leave the profile alone."""
    overrides = {
        "tp_size": options.tp,
        "host": options.host,
        "port": options.port,
        "speculative_draft_model_path": options.draft_model,
        "nnodes": options.nnodes,
        "node_rank": options.node_rank,
        "dist_init_addr": options.dist_init_addr,
    }
    return {name: value for name, value in overrides.items() if value is not None}


def planned_env(stack: dict, profile: dict, cache_dir: str) -> dict:
    """Fixed settings, then the JIT caches, then the stack's and the mode's env (later wins)."""
    env = dict(FIXED_ENV)
    for variable, subdir in CACHE_VARIABLES:
        env[variable] = os.path.join(cache_dir, subdir)
    if "nvidia-cuda-nvcc" in stack.get("distributions", {}):
        # FlashInfer compiles what the model needs at first start with the nvcc wheel, through the
        # toolkit layout the build made over it (builder/runtime/cuda_home.py).
        env["CUDA_HOME"] = str(flashinfer_bake.CUDA_HOME_DIR)
    env.update(stack["serve"].get("env", {}))
    env.update(profile.get("env", {}))
    return {name: str(value) for name, value in env.items()}


def build_plan(stack: dict, options: ServeOptions, python: str) -> LaunchPlan:
    profile = mode_profile(stack, options.mode)
    if profile.get("requires_draft_model") and not options.draft_model:
        raise UsageError(f"mode {options.mode!r} needs --draft-model PATH (the draft checkpoint)")
    if options.draft_model and not profile.get("requires_draft_model"):
        raise UsageError(f"mode {options.mode!r} takes no draft model; drop --draft-model")
    if options.node_rank is not None and options.nnodes is None:
        raise UsageError("--node-rank needs --nnodes")
    if (options.nnodes or 1) > 1 and not options.dist_init_addr:
        raise UsageError("--nnodes above 1 needs --dist-init-addr HOST:PORT")
    check_multi_node(options)
    check_extra_args(options.extra_args)
    check_model_path(options.model, "--model")
    if options.draft_model:
        check_model_path(options.draft_model, "--draft-model")

    server_args = dict(profile["args"])
    server_args.pop("model_path", None)  # the model always comes from --model
    server_args.update(user_overrides(options))
    cache_dir = options.cache_dir or stack["serve"].get("cache_dir") or "/cache"
    command = (
        python,
        "-m",
        KEYED_LAUNCHER_MODULE if options.api_key else LAUNCHER_MODULE,
        "--model-path",
        options.model,
        *stackinfo.server_arg_flags(server_args),
        *options.extra_args,
    )
    return LaunchPlan(
        mode=options.mode,
        model=options.model,
        draft_model=options.draft_model,
        command=command,
        server_args=server_args,
        env=planned_env(stack, profile, cache_dir),
        cache_dir=cache_dir,
        key=options.api_key,
    )


def child_environment(plan: LaunchPlan, base_env: dict) -> dict:
    """The server's environment: the plan's variables unless the caller set them already."""
    env = dict(plan.env)
    env.update(base_env)
    return plan.key.child_env(env) if plan.key else env
