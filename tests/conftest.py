"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest

from builder import lock


@pytest.fixture
def record_image():
    """Record an image in a lock as `builder build` does after its smoke checks pass."""

    def record(stack, image_id, tags, path=None, inputs_hash="f" * 64):
        image = lock.ImageRecord(image_id=image_id, tags=tuple(tags), inputs_hash=inputs_hash, base_digest="",
                                 source_date_epoch=1767225600, report="r.json", provenance="r.provenance.json")
        lock.record_build(stack, image, {"passed": True}, path)

    return record
