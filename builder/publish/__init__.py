"""Publish: push a locked image to a registry by manifest digest, and pull it onto a GPU host by that digest."""
