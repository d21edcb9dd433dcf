"""The names buildah's storage holds for an image: an import takes what it added away again, and a
build asks whether the image is there at all."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence


def image_names(buildah: Sequence[str], image_id: str) -> set[str]:
    """Every name of `image_id` in buildah's storage; none when the storage does not hold it."""
    result = subprocess.run([*buildah, "images", "--json", image_id], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, errors="replace")
    if result.returncode != 0:
        return set()
    return {name for image in json.loads(result.stdout or "[]") for name in image.get("names") or ()}
