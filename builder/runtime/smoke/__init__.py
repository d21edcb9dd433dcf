"""The smoke checks of a built image, run inside it: one module per family of checks."""
