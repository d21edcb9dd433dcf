"""Each install group's wheel plan (builder/oci/wheel_layer.py) in the build context, beside the group's
wheels: the image's install tool carries it out in a plain engine build, and the write-once build writes
the layer from it. A plan is made once and kept under a key of everything it is made from (the plan
format, the venv scheme, each wheel's file name and sha256), so a rebuild reads no wheel to plan it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from builder.cache.wheel_cache import LockedWheel as CachedWheel, WheelCache
from builder.config.stack import GROUP_ORDER
from builder.files import link_or_copy, write_atomic
from builder.lock.model import Resolution
from builder.oci.wheel_layer import PLAN_FORMAT, LockedWheel, VenvScheme, plan_layer
from builder.paths import VENV, VENV_PYTHON, cache_root, wheel_plan_file


def scheme_of(resolution: Resolution) -> VenvScheme:
    return VenvScheme(VENV, resolution.python, VENV_PYTHON)


def _key(scheme: VenvScheme, wheels: list[CachedWheel]) -> str:
    digest = hashlib.sha256(f"{PLAN_FORMAT}\0{scheme.prefix}\0{scheme.version}\0{scheme.interpreter}\n".encode())
    for wheel in sorted(wheels, key=lambda w: w.filename):
        digest.update(f"{wheel.filename}\0{wheel.sha256}\n".encode())
    return digest.hexdigest()


def stage_plans(resolution: Resolution, cache: WheelCache, directory: Path) -> None:
    """Every group's plan into `directory` (the context's wheels), planned from the cached wheels where
    the plan cache lacks it."""
    scheme = scheme_of(resolution)
    kept = cache_root() / "wheel-plans"
    for group in GROUP_ORDER:
        wheels = [CachedWheel(d.name, d.version, d.wheel, d.sha256, d.source, d.url)
                  for d in resolution.distributions if d.group == group]
        plan = kept / f"{_key(scheme, wheels)}.json"
        if not plan.is_file():
            kept.mkdir(parents=True, exist_ok=True)
            planned = plan_layer([LockedWheel(cache.path(w), w.sha256) for w in wheels], scheme,
                                 cache.checked_digest)
            write_atomic(plan, planned.to_json())
        link_or_copy(plan, directory / wheel_plan_file(group))
