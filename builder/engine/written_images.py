"""The images the builder wrote (engine/write_once.py), at home in the write-once OCI layout: the layout
holds an image when it holds its config and every layer, and the layout's refs are its tags.

buildah's storage is only a cache of them, filled on demand (BuildahEngine.ensure_in_storage). A ref is
stored under the full name buildah would give it (`sglang:x` is `localhost/sglang:x`), so a tag means
one image whichever way it is spelt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from builder.engine import layout_push
from builder.engine.protocol import ImageInfo, layers_from_history
from builder.oci.layout import Descriptor, Layout, LayoutError

# A full image id, or the short hex prefix `buildah images` shows.
_IMAGE_ID = re.compile(r"^(?:sha256:)?(?P<hex>[0-9a-f]{12,64})$")
_DEFAULT_TAG = "latest"


def qualified(name: str) -> str:
    """`name` as buildah stores it: under localhost/ when it names no registry, with `latest` when it
    has no tag."""
    first, _, rest = name.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        name = f"localhost/{name}"
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last or "@" in last else f"{name}:{_DEFAULT_TAG}"


def is_image_id(ref: str) -> bool:
    return _IMAGE_ID.match(ref) is not None


class WrittenImages:
    """The write-once layout's images and the refs that name them."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def resolve(self, ref: str) -> str | None:
        """The image id `ref` (a name, or an image id or its prefix) names here, None when the layout
        does not hold that image whole."""
        if (found := _IMAGE_ID.match(ref)) is not None:
            image_id = self._image_id_from_hex(found["hex"])
        else:
            image_id = self.layout.ref_image(qualified(ref))
        return image_id if image_id is not None and self.holds(image_id) else None

    def _image_id_from_hex(self, hexdigest: str) -> str | None:
        if len(hexdigest) == 64:
            return f"sha256:{hexdigest}"
        # A prefix means an image the refs name: the layout's blobs are far too many to search.
        named = set(self.layout.ref_images().values())
        matches = [image for image in named if image.removeprefix("sha256:").startswith(hexdigest)]
        return matches[0] if len(matches) == 1 else None

    def holds(self, image_id: str) -> bool:
        return layout_push.held_image(self.layout, image_id) is not None

    def image(self, image_id: str) -> tuple[bytes, list[dict]]:
        """The config's bytes and the layer descriptors of an image the layout holds."""
        held = layout_push.held_image(self.layout, image_id)
        if held is None:
            raise LayoutError(f"{self.layout.root}: lacks a blob of image {image_id}")
        return held

    def names(self, image_id: str) -> tuple[str, ...]:
        return self.layout.ref_names(image_id)

    def storage_name(self, ref: str, image_id: str) -> str:
        """The name a copy of `ref`'s image gets in buildah's storage (which names every image it holds):
        `ref` itself, or for an image id one of the layout's names of it, else one made of the id."""
        if not is_image_id(ref):
            return qualified(ref)
        return next(iter(self.names(image_id)), f"localhost/builder-written:{image_id.removeprefix('sha256:')[:12]}")

    def info(self, image_id: str) -> ImageInfo:
        """What inspect tells of an image the layout holds: sizes from its layer descriptors."""
        config_bytes, layers = self.image(image_id)
        config = json.loads(config_bytes)
        diff_ids = list(config.get("rootfs", {}).get("diff_ids", []))
        return ImageInfo(
            image_id=image_id,
            tags=self.names(image_id),
            created=config.get("created", ""),
            labels=dict(sorted((config.get("config", {}).get("Labels") or {}).items())),
            layers=layers_from_history(diff_ids, config.get("history", []), [layer["size"] for layer in layers]),
            config=config,
            config_bytes=config_bytes,
        )

    def name(self, names: Iterable[str], image_id: str) -> None:
        """Point every one of `names` at the image, in one index write: they move together or not at all."""
        config, layers = self.image(image_id)
        manifest = self.layout.write_manifest(config, layers)
        self.layout.set_refs([qualified(name) for name in names], manifest)

    def unname(self, names: Iterable[str]) -> None:
        self.layout.remove_refs([qualified(name) for name in names])

    def remove(self, ref: str) -> None:
        """The name `ref` taken away; for an image id, every name of that image. Its blobs stay: the
        layout is also the build's content cache."""
        if is_image_id(ref):
            image_id = self.resolve(ref)
            self.unname(self.names(image_id) if image_id is not None else ())
        else:
            self.unname([ref])

    def snapshot(self, names: Iterable[str]) -> dict[str, Descriptor | None]:
        """Where each name points now (None: nowhere), for restore()."""
        refs = self.layout.refs()
        return {qualified(name): refs.get(qualified(name)) for name in names}

    def restore(self, snapshot: Mapping[str, Descriptor | None]) -> None:
        """Every name of a snapshot() back where it pointed then, in one index write."""
        self.layout.update_refs(snapshot)
