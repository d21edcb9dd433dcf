"""Reproducible container images for SGLang GPU serving stacks."""
