"""Earlier lock schemas, read into the current one.

Schema 1 kept each entry flat, and its "digest" named three things: `image.id` was the image id,
`image.digest` the registry manifest digest, `base.digest` a manifest digest for registry bases and
an image id for the local base. Schema 2 splits the entry into resolution and outcome and names each
digest by what it is. A schema-1 file is read as schema 2 and rewritten by the first command that
writes the lock (store.update); nothing is lost, since every schema-1 field has a schema-2 home.
"""

from __future__ import annotations

from builder.lock.model import LockEntry


def _base(old: dict) -> dict:
    key = "image_id" if old["local"] else "manifest_digest"
    return {"name": old["name"], "image": old["image"], "local": old["local"], key: old.get("digest") or None}


def _image(old: dict | None, base: dict) -> dict | None:
    if not old:
        return None
    key = "image_id" if base["local"] else "manifest_digest"
    return {"image_id": old["id"], "immutable_tag": old["immutable_tag"], "tags": old["tags"],
            "inputs_hash": old["inputs_hash"], "base": {**base, key: old.get("base_digest") or None},
            "source_date_epoch": old["source_date_epoch"], "report": old["report"],
            "provenance": old["provenance"], "sbom": old.get("sbom"), "manifest_digest": old.get("digest")}


def _push(old: dict | None) -> dict | None:
    if not old:
        return None
    return {"registry": old["registry"], "repository": old["repository"], "tag": old["tag"],
            "manifest_digest": old["digest"]}


def entry_from_schema_1(old: dict) -> LockEntry:
    base = _base(old["base"])
    resolution = {key: old[key] for key in ("stack", "pins_hash", "python", "platform", "indexes",
                                            "index_strategy", "overrides", "source_date_epoch", "distributions")}
    pinned = old.get("pinned")
    outcome = {
        "status": old["status"],
        "image": _image(old.get("image"), base),
        "smoke": old.get("smoke"),
        "rejected_candidate": old.get("rejected_candidate"),
        "push": _push(old.get("push")),
        "bench": old.get("bench") or {},
        "pinned": {"image_id": pinned["image_id"], "manifest_digest": pinned.get("digest")} if pinned else None,
    }
    return LockEntry.from_dict({"resolution": {**resolution, "base": base}, "outcome": outcome})


MIGRATIONS = {1: entry_from_schema_1}
