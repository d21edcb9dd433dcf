"""The local Debian base: an mmdebstrap root from exactly the .debs the lock records, and reading its dpkg status."""
