"""FlashInfer modules baked at build time for the serve modes' communication paths.

    python -m builder.runtime.flashinfer_bake [--inputs /opt/builder/bake.json]   (at build, as root)

Which modules: each serve mode's communication settings name the FlashInfer module they load
(`needed_modules`). `builder render` writes them, with the targets and the cache dir, into the row's
bake.json (`bake_inputs`): the bake reads nothing else of the stack description, so a changed patch
hash or serve argument that leaves these alone does not build the modules again. They are JIT-built
for the stack's targets by FlashInfer's own JIT with the nvcc wheel, in the workspace the server uses
at run time (CACHE_DIR/flashinfer), so the build files ninja checks name the same paths then; the
result is moved to SEED_DIR, outside the cache directory, which a mounted volume hides. At start the
entrypoint copies each baked module the cache lacks (`seed_cache`); what the cache already has is
left alone.

Standard library only (runs inside the image).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from builder.runtime import cuda_home, ninja_logs

SEED_DIR = Path("/opt/builder/flashinfer-baked")
CUDA_HOME_DIR = Path("/opt/builder/cuda-home")
# FlashInfer's cache under its FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py).
CACHE_TREE = (".cache", "flashinfer")
# Communication settings -> the FlashInfer module they load (flashinfer/jit/comm.py's generator).
ENV_MODULES = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "pcie_ipc_comm"}
ARG_MODULES = {("flashinfer_allreduce_fusion_backend", "trtllm"): "trtllm_comm",
               ("flashinfer_allreduce_fusion_backend", "auto"): "trtllm_comm",
               ("enable_flashinfer_allreduce_fusion", True): "trtllm_comm"}
JIT_LOG = "flashinfer_jit.log"
GENERATORS = {"pcie_ipc_comm": "gen_pcie_ipc_comm_module", "trtllm_comm": "gen_trtllm_comm_module"}
DEFAULT_INPUTS = Path("/opt/builder/bake.json")
# What the bake imports is flashinfer and torch (FlashInfer's JIT); never these. Their patches are applied
# after the bake, so changing one does not build the modules again.
NOT_IMPORTED = ("sglang",)

# The modules are built at once, each by its own ninja: one after the other, the first (one source file)
# kept a core idle while it compiled. The lines are printed in the order asked.
_BUILD = textwrap.dedent("""
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from flashinfer.jit import comm
    specs = [getattr(comm, generator)() for generator in sys.argv[1:]]
    with ThreadPoolExecutor(len(specs)) as pool:
        list(pool.map(lambda spec: spec.build(), specs))
    for spec in specs:
        print(spec.name, spec.get_library_path())
""")


def needed_modules(stack: dict) -> list[str]:
    """The FlashInfer modules some serve mode's communication settings load, sorted."""
    found = set()
    for mode in stack["serve"]["modes"].values():
        for name, value in (mode.get("env") or {}).items():
            if name in ENV_MODULES and value not in ("", "0", "false"):
                found.add(ENV_MODULES[name])
        for name, value in mode["args"].items():
            if (name, value) in ARG_MODULES:
                found.add(ARG_MODULES[(name, value)])
    return sorted(found)


def bake_inputs(stack: dict) -> dict:
    """All the bake reads of a stack description: the modules, the targets, the cache dir."""
    return {"modules": needed_modules(stack), "serve": {"cache_dir": stack["serve"].get("cache_dir") or "/cache"},
            "target_arch": list(stack["target_arch"])}


def arch_list(stack: dict) -> str:
    """FLASHINFER_CUDA_ARCH_LIST: 12.x as the family code FlashInfer 0.7 picks itself on CUDA >= 12.9
    ("12.0f", the workspace directory 120f a run on SM120 GPUs uses), others as given."""
    return " ".join(f"{t}f" if t.split(".")[0] == "12" else t for t in stack["target_arch"])


def workspace_base(stack: dict) -> Path:
    return Path(stack["serve"].get("cache_dir") or "/cache") / "flashinfer"


def build_environment(stack: dict, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    # No MAX_JOBS: ninja runs as many jobs as it likes. nvcc writes its pid into each object, but the
    # CUDA_HOME's nvcc rewrites it (stable_nvcc.py), and the logs are sorted (ninja_logs), so neither the
    # pids nor the order jobs finish in reach the bytes.
    env.pop("MAX_JOBS", None)
    env.update(CUDA_HOME=str(home), FLASHINFER_CUDA_ARCH_LIST=arch_list(stack),
               FLASHINFER_WORKSPACE_BASE=str(workspace_base(stack)), PATH=f"{home / 'bin'}:{env.get('PATH', '')}")
    return env


def bake(inputs: dict, seed: Path = SEED_DIR, home_dir: Path = CUDA_HOME_DIR) -> list[str]:
    """Build the modules `inputs` (bake_inputs) names and move them under `seed`; returns 'name path'
    lines. Raises RuntimeError saying what failed."""
    modules = inputs["modules"]
    toolkit = cuda_home.wheel_toolkit()
    if not modules:
        return []
    if toolkit is None:
        raise RuntimeError("no nvcc wheel (nvidia/cu13/bin/nvcc) in site-packages to build "
                           f"{', '.join(modules)} with")
    home = cuda_home.assemble(home_dir, toolkit)
    done = subprocess.run([sys.executable, "-c", _BUILD, *(GENERATORS[m] for m in modules)],
                          capture_output=True, text=True, env=build_environment(inputs, home), cwd="/")
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-20:]
        raise RuntimeError("FlashInfer's JIT failed:\n" + "\n".join(tail))
    built = workspace_base(inputs).joinpath(*CACHE_TREE)
    target = seed.joinpath(*CACHE_TREE)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(built), str(target))
    shutil.rmtree(workspace_base(inputs), ignore_errors=True)  # nothing left under the cache dir
    settle(target, source_date_epoch())
    (seed / "baked.json").write_text(json.dumps({"modules": modules, "arch": arch_list(inputs)}, indent=1) + "\n")
    return done.stdout.splitlines()


def source_date_epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value.isdigit():
        raise RuntimeError(f"SOURCE_DATE_EPOCH must be set to the build's epoch, got {value!r}")
    return int(value)


def settle(tree: Path, epoch: int) -> None:
    """What would make two bakes of one stack differ, removed: FlashInfer's JIT log (wall-clock lines)
    and ninja's logs (job times and order), rewritten by ninja_logs with the image's one mtime."""
    for log in tree.rglob(JIT_LOG):
        log.unlink()
    ninja_logs.normalise_tree(tree, epoch * 10**9)


def seed_cache(workspace: Path, seed: Path = SEED_DIR) -> list[str]:
    """Copy every baked module directory the FlashInfer cache under `workspace` lacks; returns the
    modules copied. Files keep their times, so FlashInfer's ninja finds them up to date."""
    source_root = seed.joinpath(*CACHE_TREE)
    if not source_root.is_dir():
        return []
    copied = []
    for ops in sorted(source_root.glob("*/*/cached_ops")):
        for module in sorted(p for p in ops.iterdir() if p.is_dir()):
            destination = workspace.joinpath(*CACHE_TREE, module.relative_to(source_root))
            if destination.exists():
                continue
            partial = destination.with_name(destination.name + ".seeding")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(module, partial, symlinks=True)
            os.replace(partial, destination)
            copied.append(module.name)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashinfer_bake", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, default=DEFAULT_INPUTS,
                        help=f"the row's bake.json, written by `builder render` (default: {DEFAULT_INPUTS})")
    args = parser.parse_args(argv)
    try:
        inputs = json.loads(args.inputs.read_text(encoding="utf-8"))
        lines = bake(inputs)
    except KeyError as error:
        print(f"flashinfer_bake: error: {args.inputs} has no {error} (render the row again)", file=sys.stderr)
        return 1
    except (RuntimeError, OSError, ValueError, subprocess.CalledProcessError) as error:
        print(f"flashinfer_bake: error: {error}", file=sys.stderr)
        return 1
    print("\n".join(lines) if lines else "flashinfer_bake: no serve mode needs a FlashInfer module baked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
