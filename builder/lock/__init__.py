"""matrix.lock: its typed model (model), the file (store, migrate), resolving stacks into it
(resolve, resolution, and the resolvers of a base image's manifest digest and of Debian archives:
base_digest, debian_archive), what builds write back (records) and whether it is current (check).

Nothing outside this package reads a lock entry as a dict. The package imports only config and the
shared helpers below it (engine, net), so render/, build/ and publish/ may all use it without a circle.
"""
