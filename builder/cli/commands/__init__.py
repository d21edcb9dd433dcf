"""One module per `builder` subcommand.

Each module defines ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace, returning an exit status). The CLI
discovers the modules, so adding a command never touches a shared list.
"""
