"""Image references as users type them: checked before any engine or daemon is asked.

The grammar is the container registries' one: an optional registry host (with a port), one or more
lowercase path components, an optional tag and an optional sha256 digest; or an image id.
"""

from __future__ import annotations

import re

from builder.errors import UserError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?)"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$")
_IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}$")
MAX_LENGTH = 255


def check_reference(text: str) -> str:
    """`text` when it is an image reference or id; one line saying what is wrong otherwise."""
    if not text.strip():
        raise UserError("no image given: name one as REPOSITORY[:TAG][@DIGEST] or an image id")
    if len(text) > MAX_LENGTH or not (_REFERENCE.fullmatch(text) or _IMAGE_ID.fullmatch(text)):
        raise UserError(f"{text[:80]!r} is not an image reference: expected [HOST[:PORT]/]NAME[:TAG][@sha256:DIGEST] "
                        "with a lowercase NAME, or an image id")
    return text
