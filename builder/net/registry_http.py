"""Talking to a registry's HTTP API (Docker Registry v2, as OCI distribution and Docker Hub speak it):
one GET, over the schemes and with the logins transport_policy allows, and retrying what is worth
retrying.

Transient failures (connection errors, HTTP 5xx) are retried with exponential backoff; anything
else fails at once, a TLS failure on a TLS-only host included.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import requests

from builder.errors import BuildFailure
from builder.net import registry_auth, transport_policy
from builder.net.transport_policy import Kind, Login, Policy, Refused

ATTEMPTS = 4
BASE_DELAY_S = 2.0
PROBE_TIMEOUT_S = 10
MAX_REDIRECTS = 5
# What a tag may name: one image's manifest, or an index (manifest list) of one per platform.
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
)
ACCEPT_MANIFESTS = ", ".join(MANIFEST_TYPES)


# "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ... (_ssl.c:1006)" -> what follows "] ".
_TLS_WORDS = re.compile(r"\[SSL: \w+\] ([^(')\"]+)")


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


def api_get(host: str, path: str, headers: dict | None, policy: Policy) -> requests.Response:
    """GET https://host/path; where TLS is not spoken and the policy allows plain http (loopback, the
    daemon's insecure-registries) the same over http, as the daemon does. A TLS failure anywhere else
    is refused in one line, never retried over http. Connection failures and 5xx are transient."""
    kind = policy.kind(host)
    last: Exception | None = None
    for scheme in transport_policy.schemes(kind):
        try:
            return _checked(_get(f"{scheme}://{host}{path}", headers or {}, policy), host, path)
        except requests.exceptions.SSLError as error:
            if kind is Kind.TLS_ONLY:
                raise Refused(f"registry {host}: TLS failed ({tls_reason(error)}); not retried over http: "
                              f"{policy.plain_http_rule()}") from None
            last = error
        except requests.RequestException as error:
            last = error
    raise TransientError(f"registry {host} unreachable ({reason(last)})")


def _get(url: str, headers: dict, policy: Policy) -> requests.Response:
    """One GET. Redirects are followed only where the policy allows the target (no step down to plain
    http), and the Authorization header goes only to the origin it was made for."""
    for _ in range(MAX_REDIRECTS + 1):
        response = requests.get(url, headers=headers, timeout=PROBE_TIMEOUT_S, allow_redirects=False)
        if not response.is_redirect:
            return response
        target = urljoin(url, response.headers["Location"])
        policy.check_url(target)
        if _origin(target) != _origin(url):
            headers = {key: value for key, value in headers.items() if key.lower() != "authorization"}
        url = target
    raise Refused(f"{url}: more than {MAX_REDIRECTS} redirects")


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def _checked(response: requests.Response, host: str, path: str) -> requests.Response:
    if response.status_code >= 500:
        raise TransientError(f"registry {host} answered HTTP {response.status_code} on {path}")
    return response


def tls_reason(error: Exception) -> str:
    """The TLS library's own words inside requests' nested message ('certificate verify failed:
    self-signed certificate', 'wrong version number')."""
    found = _TLS_WORDS.search(str(error))
    return found.group(1).strip() if found else type(error).__name__


def reason(error: Exception | None) -> str:
    text = str(error or "")
    for needle, why in (("Connection refused", "connection refused"),
                        ("Name or service not known", "host name does not resolve"),
                        ("NameResolutionError", "host name does not resolve"),
                        ("timed out", "timed out")):
        if needle in text:
            return why
    return type(error).__name__ if error else "no answer"


def get_manifest(host: str, repository: str, reference: str, accept: str, credentials,
                 policy: Policy) -> requests.Response:
    """GET a manifest; a 401 from the registry asked is answered once as the policy allows (basic, or
    a bearer token for `credentials`, anonymous when None), over the scheme that answered, so the login
    and the token go back only to the registry that asked. A token service that cannot be reached is
    transient."""
    path, headers = f"/v2/{repository}/manifests/{reference}", {"Accept": accept}
    response = api_get(host, path, headers, policy)
    scheme, answered = _origin(response.url)
    if response.status_code != 401 or answered != host.lower():
        return response
    login = transport_policy.login_for(host, scheme, response.headers.get("WWW-Authenticate", ""),
                                       credentials is not None, policy)
    if login.method == "basic":
        authorization = registry_auth.basic(credentials)
    elif login.method == "token":
        token = _token(host, login, credentials, policy)
        if token is None:
            return response
        authorization = f"Bearer {token}"
    else:
        return response
    try:
        return _checked(_get(f"{scheme}://{host}{path}", {**headers, "Authorization": authorization}, policy),
                        host, path)
    except requests.exceptions.SSLError as error:
        raise Refused(f"registry {host}: TLS failed ({tls_reason(error)})") from None
    except requests.RequestException as error:
        raise TransientError(f"registry {host} unreachable ({reason(error)})") from None


def _token(host: str, login: Login, credentials, policy: Policy) -> str | None:
    """A token from the realm for the challenge's service and scope, asked with the login where the
    policy allows it; None when the realm refuses."""
    parts = urlsplit(login.realm)
    query = "&".join(filter(None, (parts.query, urlencode(login.query))))
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
    headers = {"Authorization": registry_auth.basic(credentials)} if login.with_credentials else {}
    try:
        return registry_auth.token_from(_get(url, headers, policy))
    except requests.exceptions.SSLError as error:
        raise Refused(f"the token service {login.realm} of {host}: TLS failed ({tls_reason(error)})") from None
    except requests.RequestException as error:
        raise TransientError(f"the token service of {host} is unreachable ({reason(error)})") from None
