"""Which engine made an image: its name and version, recorded with the image id (build report, lock).

The builder writes every layer itself (write_once.py), so two versions of buildah give one image id; the
identity still goes with every id, so that when two ids differ the message can name both engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineIdentity:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> EngineIdentity:
        name, version = data.get("name"), data.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not name or not version:
            raise ValueError(f"engine identity needs a name and a version, got {dict(data)!r}")
        return cls(name, version)


def describe(identity: EngineIdentity | None) -> str:
    """For messages: "buildah 1.28.2", or "an unrecorded engine" for an image recorded before identities."""
    return str(identity) if identity is not None else "an unrecorded engine"
