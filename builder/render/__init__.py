"""Render: a stack row into its Dockerfile, build context files and compose file under images/<stack>/."""
