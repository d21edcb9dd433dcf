"""Smoke checks from the host: run the in-image checks (builder/runtime/smoke) in a candidate image and serve the engine's storage to them."""
