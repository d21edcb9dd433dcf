"""The dpkg status file (/var/lib/dpkg/status): which Debian packages a root filesystem holds."""

from __future__ import annotations


def installed(status: str) -> list[dict[str, str]]:
    """One dict of fields per package marked installed, in file order (continuation lines joined)."""
    packages = []
    for paragraph in status.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            packages.append(fields)
    return packages
