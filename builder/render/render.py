"""Stack rows -> images/<stack>/ (Dockerfile, stack.json, requirements/, compose.yaml), byte-identical
across runs.

COPY paths are relative to the project: the rendered folder holds what is specific to a stack, and
COPY takes patches and the in-image tools from where they live, so nothing is duplicated. The build
assembles its context from exactly those files (builder/build_stack/context.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import jinja2

from builder import escape
from builder.config import compat, reference_figures
from builder.config.matrix import LOCAL_SUFFIX
from builder.config.stack import GROUP_ORDER, Stack
from builder.errors import UserError
from builder.files import write_atomic
from builder.lock import deb_listing
from builder.lock.model import Resolution
from builder.lock.resolution import base_pin, recorded_resolutions, requirements
from builder.patches import patch_series
from builder.render import compose
from builder.runtime import flashinfer_bake
from builder.paths import (DEBS_CONTEXT_DIR, DEBS_MOUNT, RUNTIME_HOME, RUNTIME_UID, RUNTIME_USER, TOOLS_DIR, VENV,
                           WHEELS_CONTEXT_DIR, WHEELS_MOUNT, Project, stack_dir, wheel_plan_file)

LABEL_PREFIX = "dev.sglang-builder"
GROUP_FILES = {"torch": "10-torch.txt", "kernels": "20-kernels.txt", "sglang": "30-sglang.txt"}
GROUP_TITLES = {
    "torch": "torch and the CUDA libraries it pulls in",
    "kernels": "kernels: sgl-kernel and flashinfer",
    "sglang": "sglang and its remaining dependencies",
}

# The stack's resolution in matrix.lock, or None when it was never locked: its requirements with
# hashes and its base digest (FROM). Build results never reach a rendered file.
ResolutionSource = Callable[[Stack], "Resolution | None"]


@dataclass(frozen=True)
class RenderedPatch:
    distribution: str
    version: str
    name: str
    source: str  # path in the build context
    target: str  # path in the image
    sha256: str
    files: tuple[str, ...]


def site_packages(stack: Stack) -> str:
    return f"{VENV}/lib/python{stack.python}/site-packages"


def rendered_patches(stack: Stack, patches_root: Path) -> list[RenderedPatch]:
    result = []
    for distribution, version in stack.patch_series:
        for patch in patch_series.series_for(distribution, version, patches_root):
            source = f"patches/{distribution}/{version}/{patch.name}"
            result.append(RenderedPatch(distribution, version, patch.name, source,
                                        f"{TOOLS_DIR}/{source}", patch.sha256, tuple(patch.files)))
    return result


def unlocked_requirements(stack: Stack) -> dict[str, str]:
    """Exact pins without hashes, for a stack `builder lock` has not resolved: builds refuse these."""
    texts = {}
    for group in GROUP_ORDER:
        lines = [f"# UNLOCKED: run `builder lock --stack {stack.name}` where its indexes are reachable.",
                 "# pip's --require-hashes refuses this file, so an unlocked stack cannot be built."]
        for package in stack.packages_in_group(group):
            # A requirement line has no quoting: only plain words (the matrix's grammar checked them).
            if package.index:
                lines.append(f"--extra-index-url {escape.bare(package.index)}")
            lines.append(f"{escape.bare(package.name)} @ {escape.bare(package.url)}" if package.url
                         else f"{escape.bare(package.name)}=={escape.bare(package.version)}")
        texts[group] = "\n".join(lines) + "\n"
    return texts


def _figure(figure: dict | None) -> dict | None:
    """A reference figure as stack.json carries it (stackinfo.py)."""
    if figure is None:
        return None
    keys = ("stack", "mode", "tok_s", "attention_backend", "model", "source")
    return {**{key: figure[key] for key in keys}, "hardware": figure["hardware"]["description"],
            "note": figure.get("note", "")}


def mode_references(stack: Stack, figures_path: Path) -> dict[str, dict]:
    """Per serve mode: this row's pinned figure and the replaced row's (bench/reference.toml).
    A -local row shares its registry row's figures, and so does the row it replaces."""
    figures = reference_figures.load(figures_path)
    own = stack.name.removesuffix(LOCAL_SUFFIX)
    replaced = stack.replaces.removesuffix(LOCAL_SUFFIX) if stack.replaces else None
    return {mode.name: {"own": _figure(reference_figures.pinned(figures, own, mode.name)),
                        "replaced": _figure(reference_figures.pinned(figures, replaced, mode.name))}
            for mode in stack.serve.modes}


def stack_json(stack: Stack, patches: list[RenderedPatch], references: dict[str, dict]) -> dict:
    return {
        "schema": 2,
        "stack": stack.name,
        "replaces": stack.replaces,
        "cuda": stack.cuda,
        "driver": compat.minimum_driver(stack.cuda),
        "python": stack.python,
        "target_arch": list(stack.target_arch),
        "venv": VENV,
        "distributions": {p.name: p.version for p in stack.packages},
        "patches": [
            {"package": p.distribution, "version": p.version, "name": p.name, "sha256": p.sha256,
             "path": p.target, "files": list(p.files)}
            for p in patches
        ],
        "serve": {
            "env": dict(stack.serve.env),
            "cache_dir": stack.serve.cache_dir,
            "modes": {
                mode.name: {"args": dict(mode.args), "env": dict(mode.env), "reasons": dict(mode.reasons),
                            "requires_draft_model": mode.requires_draft_model,
                            "reference": references[mode.name]}
                for mode in stack.serve.modes
            },
        },
        "bench": {
            "input_len": stack.bench.input_len,
            "output_len": stack.bench.output_len,
            "num_prompts": stack.bench.num_prompts,
            "regression_tolerance": stack.bench.regression_tolerance,
        },
        "jit_device_code": dict(stack.jit_device_code),
        "overrides": [
            {"package": o.package, "declared_by": o.declared_by, "declared": o.declared, "reason": o.reason}
            for o in stack.overrides
        ],
    }


def stack_labels(stack: Stack, patches: list[RenderedPatch]) -> list[dict]:
    """Labels recording what went in: pins, overrides, patch hashes, CUDA and architecture."""
    compact = {"sort_keys": True, "separators": (",", ":")}
    values = {
        "stack": stack.name,
        "cuda": stack.cuda,
        "target-arch": ",".join(stack.target_arch),
        "pins": json.dumps({p.name: p.version for p in stack.packages}, **compact),
        "overrides": json.dumps([{"package": o.package, "declared_by": o.declared_by,
                                  "declared": o.declared, "reason": o.reason} for o in stack.overrides], **compact),
        "patches": json.dumps([{"patch": p.source, "sha256": p.sha256} for p in patches], **compact),
    }
    return [{"key": f"{LABEL_PREFIX}.{key}", "value": value} for key, value in values.items()]


def _environment(templates: Path) -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    environment.filters["quoted"] = compose.quoted
    environment.filters.update(escape.FILTERS)
    return environment


def render_stack(stack: Stack, project: Project, resolution_of: ResolutionSource) -> dict[str, str]:
    """Every file of images/<stack>/, relative path -> content."""
    patches = rendered_patches(stack, project.patches)
    references = mode_references(stack, project.reference_figures)
    resolution = resolution_of(stack)
    texts = requirements(resolution) if resolution else unlocked_requirements(stack)
    context = stack_dir(stack)
    created = datetime.fromtimestamp(stack.source_date_epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    serve_port = next((m.args.get("port") for m in stack.serve.modes if "port" in m.args), 30000)
    templates = _environment(project.templates)
    # Stacks carrying the nvcc wheel bake the FlashInfer modules their serve modes load.
    bake = stack.package("nvidia-cuda-nvcc") is not None
    description = stack_json(stack, patches, references)
    dockerfile = templates.get_template("Dockerfile.j2").render(
        stack=stack,
        base_reference=stack.base.reference(base_pin(stack, resolution)),
        context=context,
        venv=VENV,
        wheels={"context": WHEELS_CONTEXT_DIR, "mount": WHEELS_MOUNT},
        debs={"context": DEBS_CONTEXT_DIR, "mount": DEBS_MOUNT, "file": deb_listing.DEBS_FILE},
        tools=TOOLS_DIR,
        user={"name": RUNTIME_USER, "id": RUNTIME_UID, "home": RUNTIME_HOME},
        site_packages=site_packages(stack),
        groups=[{"name": g, "plan": wheel_plan_file(g), "title": GROUP_TITLES[g]} for g in GROUP_ORDER],
        patch_runs=patch_runs(patches, bake),
        bake=bake,
        created=created,
        port=serve_port,
        stack_labels=stack_labels(stack, patches),
    )
    files = {f"{context}/Dockerfile": dockerfile,
             f"{context}/stack.json": json.dumps(description, indent=2, sort_keys=True) + "\n",
             f"{context}/compose.yaml": templates.get_template("compose.yaml.j2").render(
                 compose.template_values(stack))}
    if bake:
        files[f"{context}/bake.json"] = json.dumps(flashinfer_bake.bake_inputs(description), indent=2,
                                                   sort_keys=True) + "\n"
    for group in GROUP_ORDER:
        files[f"{context}/requirements/{GROUP_FILES[group]}"] = texts[group]
    if stack.base.system_packages:
        locked = resolution.system_packages if resolution else None
        files[f"{context}/{deb_listing.DEBS_FILE}"] = (deb_listing.listing(locked) if locked
                                                       else deb_listing.unlocked_listing(stack))
    return files


def patch_runs(patches: list[RenderedPatch], bake: bool) -> tuple[list[RenderedPatch], list[RenderedPatch]]:
    """The patch layers before the FlashInfer bake and after it: a patch of what the bake never imports
    comes after, so changing it does not build the modules again; every other patch comes before, as the
    bake must compile the patched sources."""
    if not bake:
        return patches, []
    unread = set(flashinfer_bake.NOT_IMPORTED)
    return ([p for p in patches if p.distribution not in unread], [p for p in patches if p.distribution in unread])


def render_all(stacks: tuple[Stack, ...], project: Project,
               resolution_of: ResolutionSource | None = None) -> dict[str, str]:
    """Every rendered file of `stacks`; requirements and base digests come from the project's lock
    unless given."""
    resolution_of = resolution_of or recorded_resolutions(project.lock)
    files: dict[str, str] = {}
    for stack in stacks:
        files.update(render_stack(stack, project, resolution_of))
    return dict(sorted(files.items()))


def write(files: dict[str, str], root: Path) -> list[str]:
    """Write rendered files; returns the paths whose content changed."""
    changed = []
    for relative, content in files.items():
        path = root / relative
        if path.is_file() and path.read_text(encoding="utf-8") == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, content)
        changed.append(relative)
    return changed


def stale(files: dict[str, str], stacks: tuple[Stack, ...], root: Path) -> list[str]:
    """Rendered files that differ from disk, are missing, or exist for these stacks but are not rendered."""
    problems = []
    for relative, content in files.items():
        path = root / relative
        if not path.is_file():
            problems.append(f"{relative} (missing)")
        elif path.read_text(encoding="utf-8") != content:
            problems.append(f"{relative} (differs)")
    for stack in stacks:
        folder = root / stack_dir(stack)
        if folder.is_dir():
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                relative = path.relative_to(root).as_posix()
                if relative not in files:
                    problems.append(f"{relative} (not rendered by any stack)")
    return problems


def require_rendered(stack: Stack, root: Path) -> None:
    """Refuse to build a stack whose folder was never rendered (whether it is locked, the lock answers)."""
    if not (root / stack_dir(stack) / "Dockerfile").is_file():
        raise UserError(f"{stack.name}: not rendered; run `builder render --stack {stack.name}`")

