"""`builder push` of an image the builder wrote: its blobs go from the write-once OCI layout itself, as
they were written (uncompressed, canonical), so the registry stores exactly the layout's manifest and
the digest is known before the push. skopeo sends only the blobs the registry lacks (it asks for each
first) and `--preserve-digests` refuses any rewrite on the way.

The layout holds an image when it holds its config (written beside the layers at the end of a build)
and every layer the config names; otherwise the engine pushes from its storage instead.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from builder.engine.process import run_quiet
from builder.errors import BuildFailure
from builder.oci import canonical
from builder.oci.layout import Layout, LayoutError, linked_layout

SKOPEO = "skopeo"
_REF = "push"


def held_image(store: Layout, image_id: str) -> tuple[bytes, list[dict]] | None:
    """The config and layer descriptors of `image_id` when `store` holds every one of its blobs."""
    if not store.has_blob(image_id):
        return None
    try:
        config = store.read_blob(image_id)
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    except (LayoutError, ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(d, str) and store.has_blob(d) for d in diff_ids):
        return None
    return config, canonical.layer_descriptors(diff_ids, {d: store.blob_path(d).stat().st_size for d in diff_ids})


def push(store: Layout, workdir: Path, image: tuple[bytes, list[dict]], destination: str, tls_verify: bool,
         auth_file: Path) -> str:
    """Push the layout's image to docker://destination (host/repository:tag); the manifest digest the
    registry stored. The image is handed to skopeo as a layout of hard links (no byte copied)."""
    config, layers = image
    with linked_layout(store, workdir, [layer["digest"] for layer in layers]) as view, \
            tempfile.TemporaryDirectory(prefix="builder-push-") as scratch:
        manifest = view.write_image(config, layers, _REF)
        digest_file = Path(scratch) / "digest"
        run_quiet([SKOPEO, "copy", "--quiet", "--preserve-digests", "--digestfile", str(digest_file),
                   f"--dest-tls-verify={str(tls_verify).lower()}", "--dest-authfile", str(auth_file),
                   f"oci:{view.root}:{_REF}", f"docker://{destination}"], f"skopeo copy to {destination}")
        digest = digest_file.read_text().strip() if digest_file.is_file() else ""
    if digest != manifest.digest:
        raise BuildFailure(f"push {destination}: the registry stored manifest {digest or 'none'}, "
                           f"the layout's is {manifest.digest}")
    return digest
