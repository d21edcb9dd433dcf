"""Code that runs INSIDE the image under the image's Python.

Standard library only, and nothing from the rest of `builder`: the image has
only its own packages. Copied in as the image's last layers.
"""
