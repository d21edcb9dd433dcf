"""Build provenance: who built which image from what, when and where, as an in-toto Statement v1
with a SLSA provenance v1 predicate (https://slsa.dev/spec/v1.0/provenance).

Everything here is about the run, not the image: the commit and whether the tree was dirty, the
builder's and the engine's versions, the host's platform (never its name), start and end times, durations. None of it may reach
the image config (that would make the image id depend on the clone, the host and the clock), so it is
written beside the build report, outside the tracked files, and referenced from the lock.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from builder.build_stack.context import BuildInputs
from builder.files import write_atomic
from builder.lock.model import Distribution

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# The label namespace `dev.sglang-builder` read as a domain: this builder's build type and identity.
BUILD_TYPE = "https://sglang-builder.dev/provenance/build/v1"
BUILDER_ID = "https://sglang-builder.dev/builder"
DISTRIBUTION = "sglang-image-builder"


@dataclass(frozen=True)
class SourceState:
    commit: str  # "" outside a git work tree
    dirty: bool  # tracked files differ from the commit
    remote: str  # origin's URL without credentials, "" when none


def _git(root: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _without_credentials(url: str) -> str:
    """https://user:token@host/repo -> https://host/repo; scp-like ssh addresses are left as they are."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url


def source_state(root: Path) -> SourceState:
    commit = _git(root, "rev-parse", "HEAD") or ""
    dirty = bool(commit) and bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    remote = _without_credentials(_git(root, "config", "--get", "remote.origin.url") or "")
    return SourceState(commit, dirty, remote)


def builder_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def statement(
    inputs: BuildInputs,
    *,
    image_id: str,
    immutable_tag: str,
    engine: str,
    engine_version: str,
    source: SourceState,
    distributions: tuple[Distribution, ...],
    started: datetime,
    finished: datetime,
    durations_s: dict,
    external: dict,
) -> dict:
    """The in-toto Statement for one built image (subject: the image id, the digest everywhere)."""
    algorithm, _, hexdigest = image_id.partition(":")
    materials = []
    if source.commit:
        commit = {"name": "source", "digest": {"gitCommit": source.commit},
                  "annotations": {"dirty": source.dirty}}
        if source.remote:
            commit["uri"] = f"git+{source.remote}"
        materials.append(commit)
    if inputs.base_pin:
        base_algorithm, _, base_hex = inputs.base_pin.partition(":")
        materials.append({"name": f"base:{inputs.base_reference}", "digest": {base_algorithm: base_hex}})
    else:
        materials.append({"name": f"base:{inputs.base_reference}", "annotations": {"digest": "unpinned"}})
    for item in sorted(distributions, key=lambda d: d.name):
        materials.append({"name": f"pypi:{item.name}=={item.version}", "digest": {"sha256": item.sha256},
                          "uri": item.url or item.wheel})
    for item in inputs.files:
        materials.append({"name": item.path, "digest": {"sha256": item.sha256}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": immutable_tag, "digest": {algorithm: hexdigest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"stack": inputs.stack, "dockerfile": inputs.dockerfile, **external},
                "internalParameters": {"source_date_epoch": inputs.source_date_epoch, "inputs_hash": inputs.hash},
                "resolvedDependencies": materials,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {DISTRIBUTION: builder_version(), engine: engine_version}},
                "metadata": {"startedOn": _time(started), "finishedOn": _time(finished)},
                "byproducts": [
                    # The platform, not the machine: a host name says where a build ran, and is not the
                    # record's to publish.
                    {"name": "host", "annotations": {"platform": platform.platform(),
                                                     "python": platform.python_version()}},
                    {"name": "durations", "annotations": {key: value for key, value in sorted(durations_s.items())}},
                ],
            },
        },
    }


def provenance_path(report_path: Path) -> Path:
    """build-reports/<stack>.json -> build-reports/<stack>.provenance.json (not tracked: see .gitignore)"""
    return report_path.with_name(report_path.stem + ".provenance.json")


def write(report_path: Path, document: dict) -> Path:
    path = provenance_path(report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path
