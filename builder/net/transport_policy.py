"""Where registry traffic may go over plain http, and where a login may go: the Docker daemon's
rules, stricter about credentials.

- Plain http only to loopback (127.0.0.0/8, ::1, `localhost`) and to the hosts the daemon's
  `insecure-registries` list names (host[:port] as written, or a CIDR holding the host's address).
  Every other host is TLS only: a TLS failure there is never retried over http.
- The Docker config's login (a Basic header, or a token bought with it) never crosses plain http to
  a host that is not loopback.
- A Bearer realm is https, unless the registry and the realm's host may both be spoken to over
  plain http. The token goes back only to the registry that asked for it (registry_http).

Host names are matched as written, never resolved: a CIDR entry covers a registry named by address.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

from builder.errors import UserError
from builder.net.loopback import address as _address
from builder.net.loopback import host_name, is_loopback
from builder.net.registry_auth import parse_challenge

DAEMON_CONFIG_ENV = "BUILDER_DOCKER_DAEMON_CONFIG"
DEFAULT_DAEMON_CONFIG = "/etc/docker/daemon.json"


class Kind(Enum):
    LOOPBACK = "loopback"
    INSECURE = "insecure-registries"
    TLS_ONLY = "TLS only"


class Refused(UserError):
    """Traffic the rules forbid, refused before any of it is sent."""


@dataclass(frozen=True)
class Login:
    """How a 401 is answered: "none" (the 401 stands), "basic", or "token" from `realm` with `query`."""

    method: str
    with_credentials: bool = False
    realm: str = ""
    query: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Policy:
    """The insecure registries the daemon's configuration lists, and the file that lists them."""

    names: frozenset[str] = frozenset()
    networks: tuple = ()
    source: str = DEFAULT_DAEMON_CONFIG

    @classmethod
    def from_entries(cls, entries, source: str) -> "Policy":
        """Entries as dockerd reads them: an http:// or https:// prefix is dropped, a CIDR is a network,
        anything else a host[:port] matched as written."""
        if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
            raise UserError(f"{source}: insecure-registries must be a list of strings")
        names, networks = set(), []
        for entry in entries:
            value = entry.strip()
            for prefix in ("http://", "https://"):
                if value.lower().startswith(prefix):
                    value = value[len(prefix):]
            if "://" in value or not value or "/" in value and not _is_cidr(value):
                raise UserError(f"{source}: insecure-registries entry {entry!r} is neither host[:port] nor a CIDR")
            if _is_cidr(value):
                networks.append(ipaddress.ip_network(value, strict=False))
            else:
                names.add(value.lower())
        return cls(frozenset(names), tuple(networks), source)

    def kind(self, host: str) -> Kind:
        host = host.lower()
        name = host_name(host)
        address = _address(name)
        if is_loopback(host):
            return Kind.LOOPBACK
        if host in self.names or address is not None and any(address in n for n in self.networks
                                                              if n.version == address.version):
            return Kind.INSECURE
        return Kind.TLS_ONLY

    def check_url(self, url: str) -> None:
        """Refuse a URL (a realm, a redirect's target) that is not https or plain http to an allowed host."""
        parts = urlsplit(url)
        if parts.scheme == "https" and parts.netloc:
            return
        if parts.scheme == "http" and parts.netloc:
            if self.kind(parts.netloc) is Kind.TLS_ONLY:
                raise Refused(f"{url}: {self.plain_http_rule()}")
            return
        raise Refused(f"{url}: not an http(s) URL")

    def plain_http_rule(self) -> str:
        return f"plain http goes only to loopback and to the insecure-registries of {self.source}"


def _is_cidr(value: str) -> bool:
    if "/" not in value:
        return False
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def load(path: str | None = None) -> Policy:
    """The policy from the daemon's configuration file (BUILDER_DOCKER_DAEMON_CONFIG, else
    /etc/docker/daemon.json); no file means no insecure registry besides loopback."""
    path = path or os.environ.get(DAEMON_CONFIG_ENV) or DEFAULT_DAEMON_CONFIG
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return Policy(source=path)
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read the Docker daemon's configuration {path}: {error}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a JSON object")
    return Policy.from_entries(config.get("insecure-registries", []), path)


def schemes(kind: Kind) -> tuple[str, ...]:
    """The schemes tried, in order, as the daemon tries them: https, then http where allowed."""
    return ("https",) if kind is Kind.TLS_ONLY else ("https", "http")


def engine_tls_verify(host: str, policy: Policy) -> bool:
    """Whether an engine (buildah, podman, skopeo: their --tls-verify) must verify TLS for `host`: off only
    for loopback, where the daemon speaks plain http too. An insecure-registries host keeps TLS on: an
    engine's switch would also send the login over plain http, which goes only to loopback."""
    return policy.kind(host) is not Kind.LOOPBACK


def credentials_may_cross(kind: Kind, scheme: str) -> bool:
    return scheme == "https" or kind is Kind.LOOPBACK


def login_for(host: str, scheme: str, challenge: str, has_credentials: bool, policy: Policy) -> Login:
    """How to answer the 401 that `host` gave over `scheme` with `challenge` (its WWW-Authenticate);
    Refused when every way to answer it breaks a rule."""
    kind = policy.kind(host)
    if scheme != "https" and kind is Kind.TLS_ONLY:
        raise Refused(f"registry {host} is TLS only: {policy.plain_http_rule()}")
    method, params = parse_challenge(challenge)
    if method == "basic":
        if not has_credentials:
            return Login("none")
        if not credentials_may_cross(kind, scheme):
            raise Refused(f"registry {host} asks for the login over plain http, and credentials go over plain "
                          "http only to loopback: serve it over TLS")
        return Login("basic", True)
    if method != "bearer" or not params.get("realm"):
        return Login("none")
    realm = params["realm"]
    try:
        policy.check_url(realm)
    except Refused as error:
        raise Refused(f"registry {host} names the token service {error}") from None
    realm_parts = urlsplit(realm)
    if realm_parts.scheme == "http" and kind is Kind.TLS_ONLY:
        raise Refused(f"registry {host} names the token service {realm}: a realm must be https unless the "
                      f"registry is loopback or in the insecure-registries of {policy.source}")
    if has_credentials and not credentials_may_cross(policy.kind(realm_parts.netloc), realm_parts.scheme):
        raise Refused(f"registry {host} names the token service {realm}, and credentials go over plain http "
                      "only to loopback")
    if has_credentials and not credentials_may_cross(kind, scheme):
        raise Refused(f"registry {host} speaks plain http, and a token bought with the login goes over plain "
                      "http only to loopback: serve it over TLS")
    query = tuple((key, params[key]) for key in ("service", "scope") if params.get(key))
    return Login("token", has_credentials, realm, query)
