"""The lock entry as typed values: what a build reads (the resolution) and what builds, pushes and
benches write back (the outcome).

Each digest says which it is: `image_id` is the sha256 of an image config (equal in buildah, the
Docker daemon and a registry); `manifest_digest` is a registry manifest's sha256 (what a pull by
digest names). Values are frozen; a change is a new value (`dataclasses.replace`).

The file holds them as JSON objects (`to_dict`/`from_dict`); only this package reads that form.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from builder.engine.identity import EngineIdentity
from builder.lock.system_packages import SystemPackages
from builder.lock.smoke_report import SmokeReport

DEFAULT_INDEX = "default index"  # a distribution's `source` when it comes from pip's default index (or a mirror)

STATUS_RESOLVED = "resolved"  # `builder lock` hashed the pins; no image yet
STATUS_SMOKE_PASSED = "smoke-passed"  # `builder build` recorded an image that passed its smoke checks
STATUS_BUILT = "built"  # the recorded image failed a later smoke run
STATUS_PINNED = "pinned"  # `builder pin` promoted it (smoke passed; reference figures recorded)


def _optional(data: dict, key: str):
    value = data.get(key)
    return value if value not in ("", None) else None


# --- the resolution: what a build reads ----------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    name: str  # canonical name
    version: str
    sha256: str  # of `wheel`, the file the target installer picks (best tag match)
    wheel: str  # filename
    hashes: tuple[str, ...]  # sha256 of every wheel of this version that fits the target, sorted
    source: str  # DEFAULT_INDEX, an extra index URL, or the direct wheel URL
    group: str  # one of config.stack.GROUP_ORDER
    url: str | None = None  # set for a direct-URL wheel: the requirement names it

    @property
    def requirement(self) -> str:
        return f"{self.name} @ {self.url}" if self.url else f"{self.name}=={self.version}"

    def to_dict(self) -> dict:
        data = {"version": self.version, "sha256": self.sha256, "wheel": self.wheel,
                "hashes": list(self.hashes), "source": self.source, "group": self.group}
        return {**data, "url": self.url} if self.url else data

    @classmethod
    def from_dict(cls, name: str, data: dict) -> Distribution:
        return cls(name, data["version"], data["sha256"], data["wheel"], tuple(data["hashes"]),
                   data["source"], data["group"], _optional(data, "url"))


@dataclass(frozen=True)
class LockedBase:
    """The image a stack builds FROM and the digest that pins it: a registry base by the manifest
    digest `builder lock` resolved, the local base by the image id `builder base` made."""

    name: str
    image: str
    local: bool
    manifest_digest: str | None = None  # registry bases only
    image_id: str | None = None  # the local base only

    @property
    def pin(self) -> str:
        """The digest this base is pinned by, or "" when none is recorded yet."""
        return (self.image_id if self.local else self.manifest_digest) or ""

    def same_base(self, other: LockedBase) -> bool:
        return (self.name, self.image, self.local) == (other.name, other.image, other.local)

    def pinned_by(self, digest: str) -> LockedBase:
        digest = digest or None
        return replace(self, image_id=digest) if self.local else replace(self, manifest_digest=digest)

    def to_dict(self) -> dict:
        data = {"name": self.name, "image": self.image, "local": self.local}
        key = "image_id" if self.local else "manifest_digest"
        return {**data, key: self.pin or None}

    @classmethod
    def from_dict(cls, data: dict) -> LockedBase:
        return cls(data["name"], data["image"], bool(data["local"]),
                   _optional(data, "manifest_digest"), _optional(data, "image_id"))


@dataclass(frozen=True)
class LockedOverride:
    package: str
    version: str  # the version pinned despite the declaration
    declared_by: str
    declared: str
    reason: str

    @classmethod
    def from_dict(cls, data: dict) -> LockedOverride:
        return cls(data["package"], data["version"], data["declared_by"], data["declared"], data["reason"])


@dataclass(frozen=True)
class Resolution:
    """What `builder lock` resolved a stack row to; every build of the row reads only this."""

    stack: str
    pins_hash: str  # of the matrix inputs it was resolved from (lock.resolution.pins_hash)
    python: str
    platform: str
    indexes: tuple[str, ...]  # extra indexes, in matrix order; pip's default index stays default
    index_strategy: str
    overrides: tuple[LockedOverride, ...]
    base: LockedBase
    source_date_epoch: int
    distributions: tuple[Distribution, ...]  # sorted by name
    # The .debs: the local base's whole root, or what a row adds to its registry base. None: the row
    # names none, or its archive was unreachable where it was locked (its build is refused).
    system_packages: SystemPackages | None = None

    @property
    def distributions_hash(self) -> str:
        """What changes when any locked file does: keeps an image's record across a no-op relock."""
        text = json.dumps({d.name: d.to_dict() for d in self.distributions}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def distribution(self, name: str) -> Distribution | None:
        return next((d for d in self.distributions if d.name == name), None)

    def to_dict(self) -> dict:
        return {
            "stack": self.stack, "pins_hash": self.pins_hash, "python": self.python, "platform": self.platform,
            "indexes": list(self.indexes), "index_strategy": self.index_strategy,
            "overrides": [asdict(o) for o in self.overrides], "base": self.base.to_dict(),
            "source_date_epoch": self.source_date_epoch,
            "distributions": {d.name: d.to_dict() for d in self.distributions},
            "distributions_hash": self.distributions_hash,
            "system_packages": self.system_packages.to_dict() if self.system_packages else None,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Resolution:
        return cls(
            data["stack"], data["pins_hash"], data["python"], data["platform"], tuple(data["indexes"]),
            data["index_strategy"], tuple(LockedOverride.from_dict(o) for o in data["overrides"]),
            LockedBase.from_dict(data["base"]), int(data["source_date_epoch"]),
            tuple(Distribution.from_dict(name, item) for name, item in sorted(data["distributions"].items())),
            SystemPackages.from_dict(data["system_packages"]) if data.get("system_packages") else None,
        )


# --- the outcome: what builds, pushes and benches write back --------------------------------------


@dataclass(frozen=True)
class ImageRecord:
    """A built image that passed its smoke checks: what it is, what it was made from, where its
    records are (paths relative to the project)."""

    image_id: str
    immutable_tag: str
    tags: tuple[str, ...]  # the immutable tag first, then moving ones
    inputs_hash: str
    base: LockedBase  # the base as pinned when this image was built
    source_date_epoch: int
    report: str
    provenance: str
    sbom: str | None = None
    manifest_digest: str | None = None  # set by `builder push`
    engine: EngineIdentity | None = None  # the engine (and version) that made it; None: not recorded

    def to_dict(self) -> dict:
        return {**asdict(self), "tags": list(self.tags), "base": self.base.to_dict(),
                "engine": self.engine.to_dict() if self.engine else None}

    @classmethod
    def from_dict(cls, data: dict) -> ImageRecord:
        engine = EngineIdentity.from_dict(data["engine"]) if data.get("engine") else None
        return cls(data["image_id"], data["immutable_tag"], tuple(data["tags"]), data["inputs_hash"],
                   LockedBase.from_dict(data["base"]), int(data["source_date_epoch"]), data["report"],
                   data["provenance"], _optional(data, "sbom"), _optional(data, "manifest_digest"), engine)


@dataclass(frozen=True)
class SmokeRecord:
    image_id: str | None
    passed: bool
    report: SmokeReport | None

    def to_dict(self) -> dict:
        return {"image_id": self.image_id, "passed": self.passed,
                "report": self.report.to_dict() if self.report else None}

    @classmethod
    def from_dict(cls, data: dict) -> SmokeRecord:
        report = data.get("report")
        return cls(data.get("image_id"), bool(data["passed"]),
                   SmokeReport.from_dict(report) if report is not None else None)


@dataclass(frozen=True)
class PushRecord:
    registry: str
    repository: str
    tag: str
    manifest_digest: str

    @property
    def reference(self) -> str:
        return f"{self.registry}/{self.repository}@{self.manifest_digest}"

    def to_dict(self) -> dict:
        return {**asdict(self), "reference": self.reference}

    @classmethod
    def from_dict(cls, data: dict) -> PushRecord:
        return cls(data["registry"], data["repository"], data["tag"], data["manifest_digest"])


@dataclass(frozen=True)
class MeasuredFigure:
    """A bench figure measured on the recorded image (from a bench report, runtime/serve/bench.py)."""

    mode: str
    tok_s: float
    model: str
    hardware: str
    image_id: str
    ttft_ms: float | None = None
    verdict: str | None = None
    reference_tok_s: float | None = None
    workload: dict | None = None
    report: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.mode, self.hardware, self.model)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MeasuredFigure:
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Bench:
    reference: tuple[dict, ...] = ()  # reference figures as config/reference_figures.py loads them
    measured: tuple[MeasuredFigure, ...] = ()

    def to_dict(self) -> dict:
        return {"reference": list(self.reference), "measured": [f.to_dict() for f in self.measured]}

    @classmethod
    def from_dict(cls, data: dict) -> Bench:
        return cls(tuple(data.get("reference", ())), tuple(MeasuredFigure.from_dict(f) for f in data.get("measured", ())))


@dataclass(frozen=True)
class PinnedRecord:
    image_id: str
    manifest_digest: str | None

    @classmethod
    def from_dict(cls, data: dict) -> PinnedRecord:
        return cls(data["image_id"], _optional(data, "manifest_digest"))


@dataclass(frozen=True)
class Outcome:
    status: str = STATUS_RESOLVED
    image: ImageRecord | None = None
    smoke: SmokeRecord | None = None
    rejected_candidate: SmokeRecord | None = None  # a candidate that failed smoke and was never recorded
    push: PushRecord | None = None
    bench: Bench = field(default_factory=Bench)
    pinned: PinnedRecord | None = None

    @property
    def smoke_passed(self) -> bool:
        """The recorded image passed its smoke checks (the result is about that very image)."""
        return bool(self.image and self.smoke and self.smoke.passed and self.smoke.image_id == self.image.image_id)

    def to_dict(self) -> dict:
        def optional(value):
            return None if value is None else (value.to_dict() if hasattr(value, "to_dict") else asdict(value))
        return {"status": self.status, "image": optional(self.image), "smoke": optional(self.smoke),
                "rejected_candidate": optional(self.rejected_candidate), "push": optional(self.push),
                "bench": self.bench.to_dict(), "pinned": optional(self.pinned)}

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        def optional(kind, key):
            return kind.from_dict(data[key]) if data.get(key) else None
        return cls(data["status"], optional(ImageRecord, "image"), optional(SmokeRecord, "smoke"),
                   optional(SmokeRecord, "rejected_candidate"), optional(PushRecord, "push"),
                   Bench.from_dict(data.get("bench") or {}), optional(PinnedRecord, "pinned"))


@dataclass(frozen=True)
class LockEntry:
    resolution: Resolution
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def name(self) -> str:
        return self.resolution.stack

    def with_outcome(self, **changes) -> LockEntry:
        return replace(self, outcome=replace(self.outcome, **changes))

    def to_dict(self) -> dict:
        return {"resolution": self.resolution.to_dict(), "outcome": self.outcome.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> LockEntry:
        return cls(Resolution.from_dict(data["resolution"]), Outcome.from_dict(data["outcome"]))
