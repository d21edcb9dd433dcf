"""Image names: an immutable tag named by the inputs hash (builder/build_stack/context.py), a moving stack tag,
a candidate tag. Changing a pin, a lock hash, a patch or an in-image tool gives a new immutable tag,
and the same inputs always give the same one.
"""

from __future__ import annotations

from builder.config.stack import Stack

def _short_name(stack: Stack) -> str:
    """'sglang-0.5.9-cu130' in repository 'sglang' -> '0.5.9-cu130'."""
    return stack.name.removeprefix(stack.repository + "-")


def immutable_tag(stack: Stack, hash_hex: str) -> str:
    return f"{stack.repository}:{_short_name(stack)}-{hash_hex[:12]}"


def moving_tag(stack: Stack) -> str:
    return f"{stack.repository}:{_short_name(stack)}"


def candidate_tag(stack: Stack, hash_hex: str) -> str:
    """Where a build lands until its smoke test passes; removed either way."""
    return f"{stack.repository}-candidate:{_short_name(stack)}-{hash_hex[:12]}"
