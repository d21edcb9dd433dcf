"""Talking to a registry's HTTP API (Docker Registry v2, as OCI distribution and Docker Hub speak it):
one GET, and retrying what is worth retrying.

Transient failures (connection errors, HTTP 5xx) are retried with exponential backoff; anything
else fails at once.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import requests

from builder.errors import BuildFailure
from builder.publish import registry_auth

ATTEMPTS = 4
BASE_DELAY_S = 2.0
PROBE_TIMEOUT_S = 10
# What a tag may name: one image's manifest, or an index (manifest list) of one per platform.
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)
ACCEPT_MANIFESTS = ", ".join(MANIFEST_TYPES)


class TransientError(Exception):
    """A failure worth retrying: the registry could not be reached or answered 5xx."""


@dataclass(frozen=True)
class Retry:
    attempts: int = ATTEMPTS
    base_delay_s: float = BASE_DELAY_S
    sleep: Callable[[float], None] = time.sleep
    failure: type[Exception] = BuildFailure  # what giving up raises

    def run(self, what: str, action: Callable[[], object]):
        for attempt in range(1, self.attempts + 1):
            try:
                return action()
            except TransientError as error:
                if attempt == self.attempts:
                    raise self.failure(f"{what} failed after {self.attempts} attempts: {error}") from None
                delay = self.base_delay_s * 2 ** (attempt - 1)
                print(f"builder: {what}: {error}; retrying in {delay:g} s "
                      f"(attempt {attempt + 1} of {self.attempts})", file=sys.stderr)
                self.sleep(delay)
        raise AssertionError("unreachable")


def api_get(host: str, path: str, headers: dict | None = None) -> requests.Response:
    """GET https://host/path, falling back to plain http where TLS is not spoken (a loopback
    registry, which the daemon treats as insecure). Connection failures and 5xx are transient."""
    last: Exception | None = None
    for scheme in ("https", "http"):
        try:
            response = requests.get(f"{scheme}://{host}{path}", headers=headers or {}, timeout=PROBE_TIMEOUT_S)
        except requests.RequestException as error:
            last = error
            continue
        if response.status_code >= 500:
            raise TransientError(f"registry {host} answered HTTP {response.status_code} on {path}")
        return response
    raise TransientError(f"registry {host} unreachable ({reason(last)})")


def reason(error: Exception | None) -> str:
    text = str(error or "")
    for needle, why in (("Connection refused", "connection refused"),
                        ("Name or service not known", "host name does not resolve"),
                        ("NameResolutionError", "host name does not resolve"),
                        ("timed out", "timed out")):
        if needle in text:
            return why
    return type(error).__name__ if error else "no answer"


def get_manifest(host: str, repository: str, reference: str, accept: str, credentials) -> requests.Response:
    """GET a manifest; a 401 is answered once with the challenge's login (basic, or a bearer token
    for `credentials`, anonymous when None). A token service that cannot be reached is transient."""
    path, headers = f"/v2/{repository}/manifests/{reference}", {"Accept": accept}
    response = api_get(host, path, headers)
    if response.status_code == 401:
        try:
            login = registry_auth.answer(response.headers.get("WWW-Authenticate", ""), credentials)
        except requests.RequestException as error:
            raise TransientError(f"the token service of {host} is unreachable ({reason(error)})") from None
        if login is not None:
            response = api_get(host, path, {**headers, **login})
    return response
