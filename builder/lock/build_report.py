"""The build report (build-reports/<stack>.json): what an image is, as `builder build` writes it and the
lock names it. A function of the image and its inputs, never of the run (no times, no host), so
rebuilding the same image writes the same bytes. Read back by `lock --check` (which input files moved),
`verify --against-lock` (the locked layers and config), the bump report and the status page (sizes, smoke),
and the bench; they read its fields, never its keys."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from builder.engine.identity import EngineIdentity
from builder.files import write_atomic
from builder.lock.smoke_report import SmokeReport


@dataclass(frozen=True)
class InputFile:
    path: str
    mode: int
    sha256: str


@dataclass(frozen=True)
class ReportLayer:
    diff_id: str
    size: int | None  # None where the engine did not say
    step: str  # the history's created_by


@dataclass(frozen=True)
class BuildReport:
    stack: str
    engine: str
    engine_identity: EngineIdentity | None  # name and version of what made the id (the id is the same across them)
    image_id: str
    tags: tuple[str, ...]
    source_date_epoch: int
    inputs_hash: str
    base: str  # reference@pin, or reference@unpinned
    files: tuple[InputFile, ...]
    layers: tuple[ReportLayer, ...]
    config: dict  # the config whose sha256 is the image id: what verify --against-lock compares without the image
    smoke: SmokeReport

    @property
    def image_bytes(self) -> int:
        return sum(layer.size or 0 for layer in self.layers)

    def patch_layers(self) -> list[ReportLayer]:
        """The layers the patch series' applier wrote (one a patch)."""
        return [layer for layer in self.layers if "apply_patch.py" in layer.step and "--site-packages" in layer.step]

    def to_dict(self) -> dict:
        return {
            "stack": self.stack,
            "engine": self.engine,
            "engine_identity": self.engine_identity.to_dict() if self.engine_identity else None,
            "image_id": self.image_id,
            "tags": list(self.tags),
            "source_date_epoch": self.source_date_epoch,
            "inputs": {"hash": self.inputs_hash, "base": self.base,
                       "files": [{"path": f.path, "mode": f"{f.mode:o}", "sha256": f.sha256} for f in self.files]},
            "layers": [{"diff_id": layer.diff_id, "bytes": layer.size, "step": layer.step}
                       for layer in self.layers],
            "config": dict(self.config),
            "patch_layers": [{"step": layer.step, "bytes": layer.size} for layer in self.patch_layers()],
            "smoke": self.smoke.to_dict(),
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict) -> BuildReport:
        """The form to_dict writes; KeyError, TypeError or ValueError for anything else."""
        inputs, identity = data["inputs"], data.get("engine_identity")
        return cls(
            stack=_text(data["stack"]), engine=_text(data["engine"]),
            engine_identity=EngineIdentity.from_dict(identity) if identity is not None else None,
            image_id=_text(data["image_id"]), tags=tuple(_text(tag) for tag in data["tags"]),
            source_date_epoch=int(data["source_date_epoch"]), inputs_hash=_text(inputs["hash"]),
            base=_text(inputs["base"]),
            files=tuple(InputFile(_text(f["path"]), int(_text(f["mode"]), 8), _text(f["sha256"])) for f in inputs["files"]),
            layers=tuple(ReportLayer(_text(layer["diff_id"]), _size(layer["bytes"]), _text(layer["step"]))
                         for layer in data["layers"]),
            config=_mapping(data["config"]), smoke=SmokeReport.from_dict(data["smoke"]),
        )


def read(path: Path) -> BuildReport:
    """The report at `path`; OSError when it cannot be read, ValueError when it is not a build report."""
    try:
        return BuildReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a build report ({type(error).__name__}: {error})") from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _size(value: object) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise TypeError(f"expected a size in bytes, got {type(value).__name__}")
    return value


def _mapping(value: object) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value
