"""How RUN steps reach package indexes from this host: extra name entries and a CA bundle.

Some hosts (these machines among them) reach the package indexes through names pinned in /etc/hosts
and a TLS-inspecting proxy whose CA is only in the host's bundle. A build gets both at build time
only: the names as `--add-host` pairs (kept in the RUN step's /etc/hosts, never in a layer) and the
bundle as a secret mount (`RUN --mount=type=secret,id=cacert`, read from /run/secrets/cacert).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

HOSTS_FILE = Path("/etc/hosts")
CA_SECRET_ID = "cacert"
CA_SECRET_PATH = f"/run/secrets/{CA_SECRET_ID}"
# Debian's bundle (update-ca-certificates), which holds any locally added CA as well.
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class HostNetwork:
    add_hosts: tuple[str, ...] = ()  # "name:ip", sorted
    secrets: dict[str, Path] = field(default_factory=dict)  # {"cacert": bundle} when one exists


def parse_hosts(text: str) -> tuple[str, ...]:
    """'name:ip' for every entry that a container can use: loopback, link-local and multicast
    addresses point at the container itself (or nowhere), so they are left out."""
    pairs = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split()
        if len(line) < 2:
            continue
        address, names = line[0], line[1:]
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            continue
        if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
            continue
        for name in names:
            if name != "localhost" and not name.startswith("ip6-"):
                pairs.add(f"{name}:{ip}")
    return tuple(sorted(pairs))


def ca_bundle(default: Path = DEFAULT_CA_BUNDLE) -> Path | None:
    """The CA bundle the host trusts: $SSL_CERT_FILE / $PIP_CERT / $REQUESTS_CA_BUNDLE if set to a
    file, else Debian's bundle; None when none exists (the image's own CA store must do)."""
    for variable in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(variable)
        if value and Path(value).is_file():
            return Path(value)
    return default if default.is_file() else None


def host_network(hosts_file: Path = HOSTS_FILE) -> HostNetwork:
    text = hosts_file.read_text() if hosts_file.is_file() else ""
    bundle = ca_bundle()
    return HostNetwork(
        add_hosts=parse_hosts(text),
        secrets={CA_SECRET_ID: bundle} if bundle is not None else {},
    )
