"""Patches, host side: each row's patch series, and the verdict of a patch against a newer upstream release (the in-image applier is builder/runtime/apply_patch.py)."""
