"""Immutable tags never move: a tag named after the inputs hash must keep naming the image those
inputs made, in every store the engine tags in (buildah's storage and the Docker daemon alike).

When it already names another image, the inputs did not determine the image (something outside
them reached it), and moving the tag would hide exactly that; the build stops and says where the
two images part: the first differing layer, or else the differing config fields.
"""

from __future__ import annotations

from builder.engine.identity import EngineIdentity, describe
from builder.engine.protocol import Engine, ImageInfo
from builder.errors import BuildFailure
from builder.lock.model import ImageRecord
from builder.oci.layer_diff import config_differences, first_differing_layer

_FIELDS_SHOWN = 6


def first_difference(held: ImageInfo, built: ImageInfo) -> str:
    index, step = first_differing_layer(held.layers, built.layers)
    if index is not None:
        return f"first differing layer #{index + 1}, made by: {(step or 'unknown step')[:160]}"
    fields = config_differences(dict(held.config), dict(built.config))
    if not fields:
        return "layers equal; the config differs in fields this store does not show"
    more = f" and {len(fields) - _FIELDS_SHOWN} more" if len(fields) > _FIELDS_SHOWN else ""
    return f"all layers equal; config differs in {', '.join(fields[:_FIELDS_SHOWN])}{more}"


def recorded_engine(image: ImageRecord | None, image_id: str | None) -> EngineIdentity | None:
    """The engine a lock image record says made `image_id`; None when it records another image or none."""
    return image.engine if image is not None and image.image_id == image_id else None


def check(engine: Engine, tag: str, image_id: str, built_by: EngineIdentity | None = None,
          locked_image: ImageRecord | None = None) -> None:
    """Raise BuildFailure when `tag` names an image other than `image_id` in any of the engine's stores.
    The message names the engine of each: this build's (`built_by`), and the held image's where the lock's
    image record (`locked_image`) is that image."""
    for where, store in engine.stores():
        held = store.image_id(tag)
        if held is None or held == image_id:
            continue
        difference = first_difference(store.inspect(held), store.inspect(image_id))
        raise BuildFailure(
            f"immutable tag {tag} already names {held} (made by {describe(recorded_engine(locked_image, held))}) "
            f"in {where}, this build made {image_id} (with {describe(built_by)}): "
            f"{difference}; no tag moved (the inputs did not determine the image: "
            f"`builder verify --against-lock` shows why, remove the old image to accept the new one)"
        )
