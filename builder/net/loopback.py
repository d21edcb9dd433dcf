"""Whether a host is this machine's loopback, by its parsed name: 127.0.0.0/8, ::1 or the literal
`localhost`. Never by string prefix (`localhost.evil.example` and `127.0.0.1.evil.example` are other
hosts). The one predicate the transport policy, the engines' TLS switch and the matrix's URL rule ask."""

from __future__ import annotations

import ipaddress
import re

LOOPBACK_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def host_name(host: str) -> str:
    """'host:5000' -> 'host'; '[::1]:5000' -> '::1'; '::1' -> '::1'. A bracket form with anything but a
    port after it ('[::1].evil') is no address: it is returned whole, a name matched as written."""
    if host.startswith("["):
        inside, _, rest = host[1:].partition("]")
        return inside if re.fullmatch(r"(?::[0-9]+)?", rest) else host
    return host.partition(":")[0] if host.count(":") == 1 else host


def address(name: str):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback_name(name: str) -> bool:
    """`name` is a bare host name or address (no port, no brackets)."""
    name = name.lower()
    parsed = address(name)
    if parsed is None:
        return name == "localhost"
    return any(parsed in network for network in LOOPBACK_NETWORKS if network.version == parsed.version)


def is_loopback(host: str) -> bool:
    """`host` as a registry is named: host[:port], [v6]:port or a bare v6 address."""
    return is_loopback_name(host_name(host))
