"""Logging in to a registry's HTTP API with the credentials the Docker config holds.

A registry that wants a login answers 401 with a challenge (`WWW-Authenticate`): `Basic` (as
Distribution does with htpasswd) is answered with the user and password; `Bearer realm=...,
service=..., scope=...` (Docker Hub, GHCR, Harbor, Distribution with token auth) by asking the
realm for a token, with the user and password where the config has them, anonymously otherwise.
Which of those may be sent where is transport_policy's to say; registry_http sends them.
The credentials come from where `docker login` put them (DOCKER_CONFIG or ~/.docker/config.json,
credential helpers included), read through the Docker SDK, so the daemon's push uses the same ones.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass

import docker.auth
import docker.errors

from builder.errors import UserError

_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def for_daemon(self, host: str) -> dict:
        """The auth_config the Docker SDK hands the daemon for a push or pull."""
        return {"username": self.username, "password": self.password, "serveraddress": host}


def config_path() -> str:
    """Where `docker login` keeps credentials, as the SDK and the CLI find it."""
    return os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")


def docker_credentials(host: str) -> Credentials | None:
    """The user and password the Docker config holds for `host` (None when it holds none)."""
    try:
        config = docker.auth.load_config()
        entry = docker.auth.resolve_authconfig(config, host)
    except (docker.errors.DockerException, OSError, ValueError) as error:
        raise UserError(f"cannot read registry credentials from {config_path()}: {error}") from None
    if not entry or not entry.get("username") or entry.get("password") is None:
        return None
    return Credentials(entry["username"], entry["password"])


def parse_challenge(header: str) -> tuple[str, dict]:
    """'Bearer realm="https://auth/token",service="reg"' -> ('bearer', {'realm': ..., 'service': ...})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_PARAM.findall(rest))


def basic(credentials: Credentials) -> str:
    """The Authorization value of a Basic login."""
    pair = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def token_from(response) -> str | None:
    """The token in a token service's answer ({"token": ...} or {"access_token": ...}); None when it refused."""
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("token") or body.get("access_token") if isinstance(body, dict) else None
