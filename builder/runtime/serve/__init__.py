"""Serving inside the image: the entrypoint, its pre-flight, the supervised server, the benchmark."""
