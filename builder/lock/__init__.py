"""matrix.lock: its typed model (model), the file (store, migrate), resolving stacks into it
(resolve, resolution), what builds write back (records) and whether it is current (check).

Nothing outside this package reads a lock entry as a dict. The package imports only config and the
shared helpers, so image/ and publish/ may both use it without a circle.
"""
